"""The report as Markdown (report.md): tables a code review or a wiki renders."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.results.report.tables import Report


def render_markdown(report: Report) -> str:
    out = [f"# {_md(report.title)}", ""]
    for card in report.answers:  # the answer first, one card per machine
        out += [f"## {_md(card.title)}", ""]
        out += [f"- **{_md(label)}:** {_md(text)}" for label, text in card.lines()]
        out.append("")
    if report.answers:
        out += ["## The sweep", ""]
    out += [f"- {_md(line)}" for line in report.headlines]
    for table in report.tables:
        out += ["", f"## {_md(table.title)}", ""]
        out.append("| " + " | ".join(_md(h) for h in table.headers) + " |")
        out.append("|" + "|".join(" --- " for _ in table.headers) + "|")
        out += ["| " + " | ".join(_md(c) for c in row.cells) + " |" for row in table.rows]
        out += [""] + [f"*{_md(note)}*  " for note in table.notes]
    if report.plots:
        out += ["", "## Plots", ""]
        for path, caption in report.plots:
            out += [f"![{_md(caption)}]({path})", "", f"*{_md(caption)}*", ""]
    return "\n".join(out).rstrip() + "\n"


def _md(text: str) -> str:
    """Cell-safe Markdown: no table breaks, no stray emphasis or HTML."""
    text = " ".join(str(text).split())
    for ch in "\\|*_`[]<>":
        text = text.replace(ch, "\\" + ch)
    return text
