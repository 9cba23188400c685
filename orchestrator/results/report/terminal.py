"""The report in a terminal, with rich."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from orchestrator.results.report.tables import Report


_ROW_STYLE = {"failed": "red", "oversubscribed": "yellow", "pareto": "bold green"}


_NUMERIC = frozenset(
    {"workers", "n", "units/s", "per vCPU", "eff.", "peak RSS", "CPU", "vCPUs", "trials", "repeat"}
)


def render_console(report: Report, console: Console) -> None:
    """Compact tables (no vertical rules) so the main one fits a 100-column terminal."""
    from rich import box
    from rich.table import Table as RichTable

    console.print(f"[bold]{_rich_escape(report.title)}[/bold]")
    for line in report.headlines:
        console.print(f"• {_rich_escape(line)}")
    for table in report.tables:
        rich_table = RichTable(
            title=table.title,
            box=box.SIMPLE_HEAD,
            pad_edge=False,
            collapse_padding=True,
            title_justify="left",
            title_style="bold",
        )
        for header in table.headers:
            numeric = header in _NUMERIC or header.startswith("$")
            rich_table.add_column(
                header,
                justify="right" if numeric else "left",
                no_wrap=header == "machine",
                overflow="fold",
            )
        for row in table.rows:
            style = next((s for f, s in _ROW_STYLE.items() if f in row.flags), None)
            rich_table.add_row(*(_rich_escape(c) for c in row.cells), style=style)
        console.print(rich_table)
        for note in table.notes:
            console.print(f"[dim]{_rich_escape(note)}[/dim]")
        console.print()


def _rich_escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)
