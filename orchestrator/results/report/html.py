"""The report as one self-contained HTML page (report.html).

The page answers first (the answer cards and the sweep's headlines), then shows the
figures a user looks at, then the tables. The figures come in as Vega-Lite specs (drawn by
``orchestrator.results.plots``, which this package never imports) with the Vega script
inlined, so the one file can be mailed or attached to a ticket and still draws every
figure, with tooltips, zoom and legend toggles, and nothing is fetched from the network.
Without specs, figures listed in ``report.plots`` are inlined as ``data:`` URIs.
"""

from __future__ import annotations

import base64
import html
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.results.report.tables import Report

_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
.answers{display:flex;flex-wrap:wrap;gap:1em;margin:1em 0}
.card{border:2px solid #2e7d32;border-radius:8px;padding:.6em 1em;max-width:44em;flex:1 1 22em}
.card h2{margin:.2em 0 .5em;font-size:1.25em}
.card dl{display:grid;grid-template-columns:max-content 1fr;gap:.35em 1em;margin:0}
.card dt{font-weight:bold}
.card dd{margin:0}
.card dd.hardware{color:#8a5a00}
.wide{overflow-x:auto;max-width:100%}
.nw{white-space:nowrap}
table{border-collapse:collapse;margin:1em 0}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:left}
th{background:#f3f3f3}
tr.oversubscribed td{background:#fff6d5}
tr.failed td{background:#fde2e2}
tr.pareto td:first-child{font-weight:bold}
p.note{color:#555;font-size:90%;margin:.2em 0}
figure{display:inline-block;margin:1em 1em 1em 0;width:min(100%,40em);vertical-align:top}
figure.wide{width:auto;max-width:100%}
figcaption{color:#555;font-size:90%;max-width:44em}
figure img{max-width:100%;height:auto}
.chart{width:100%;overflow-x:auto}
.vega-bind{font-size:90%;margin:.3em 0}
p.hint{color:#555;font-size:90%}
details summary{cursor:pointer;color:#2e7d32;font-weight:bold}
@media (max-width:600px){body{margin:.8em}h1{font-size:1.4em}.card dl{grid-template-columns:1fr}
.card dd{margin-bottom:.4em}figure{margin:1em 0}}
"""


_NO_BREAK_MAX = 40  # characters: a hyphenated word longer than this may still be broken

MEDIA_TYPES = {".svg": "image/svg+xml", ".png": "image/png"}


def data_uri(image: Path) -> str:
    """An image file as a ``data:<media type>;base64,...`` URI (SVG; PNG in older stores)."""
    media = MEDIA_TYPES.get(image.suffix.lower(), "application/octet-stream")
    return f"data:{media};base64," + base64.b64encode(image.read_bytes()).decode("ascii")


def render_html(report: Report, base_dir: Path | None = None,
                charts: list[tuple[str, dict[str, Any]]] | None = None,
                script: str | None = None) -> str:
    """The page. ``charts``: (caption, Vega-Lite spec) per figure, drawn by ``script``
    (Vega, Vega-Lite and vega-embed, inlined). Without charts, ``report.plots`` are shown
    as images: inlined from ``base_dir/path`` with ``base_dir`` (the store), else linked
    by their relative path (a preview that writes no plots).
    """
    e = html.escape
    out = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{e(report.title)}</title>",
        f"<style>{_CSS}</style>",
        *([f"<script>{_inline_script(script)}</script>"] if charts and script else []),
        "</head>",
        "<body>",
        f"<h1>{e(report.title)}</h1>",
        *_answers(report),
        *_headlines(report),
    ]
    out += _charts(charts) if charts and script else _images(report, base_dir)
    for table in report.tables:
        out.append(f"<h2>{e(table.title)}</h2>")
        out.append('<div class="wide"><table>')
        out.append("<tr>" + "".join(f"<th>{e(h)}</th>" for h in table.headers) + "</tr>")
        for row in table.rows:
            cls = f' class="{" ".join(sorted(row.flags))}"' if row.flags else ""
            out.append(f"<tr{cls}>" + "".join(f"<td>{_no_break(c)}</td>" for c in row.cells)
                       + "</tr>")
        out.append("</table></div>")
        out += [f'<p class="note">{e(note)}</p>' for note in table.notes]
    out += ["</body>", "</html>"]
    return "\n".join(out) + "\n"


def _inline_script(text: str) -> str:
    """Script text that cannot close its ``<script>`` element early."""
    return text.replace("</script", "<\\/script")


def _charts(charts: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """One figure per spec, drawn on a canvas by vega-embed when the page loads."""
    e = html.escape
    out = ["<h2>Plots</h2>",
           '<p class="hint">Hover a point for its values and interval; scroll to zoom, drag '
           "to pan, double-click to reset; click a legend entry to fade the other series "
           "(shift-click for more).</p>"]
    specs = []
    for i, (caption, spec) in enumerate(charts):
        single = "hconcat" not in spec and "vconcat" not in spec and "facet" not in spec
        specs.append({**spec, "width": "container"} if single else spec)  # fits a phone
        wide = "" if single else ' class="wide"'
        out.append(f"<figure{wide}>"
                   f'<div class="chart" id="chart-{i}"></div>'
                   f"<figcaption>{e(caption)}</figcaption></figure>")
    specs = json.dumps(specs, separators=(",", ":"), allow_nan=False)
    out.append("<script>const specs=" + specs.replace("</", "<\\/") + ";\n"
               "specs.forEach((spec,i)=>vegaEmbed('#chart-'+i,spec,"
               "{actions:false,renderer:'canvas'}).catch(err=>{"
               "document.getElementById('chart-'+i).textContent='figure not drawn: '+err;}));"
               "</script>")
    return out


def _images(report: Report, base_dir: Path | None) -> list[str]:
    if not report.plots:
        return []
    e = html.escape
    out = ["<h2>Plots</h2>"]
    for path, caption in report.plots:
        src = data_uri(base_dir / path) if base_dir is not None else path
        out.append(
            f'<figure><img src="{e(src, quote=True)}" alt="{e(caption, quote=True)}">'
            f"<figcaption>{e(caption)}</figcaption></figure>"
        )
    return out


def _no_break(text: str) -> str:
    """Escaped text whose hyphenated words (machine names, flags) a line never splits:
    "n2-" over "highcpu-8" reads as two names."""

    def keep(match: re.Match[str]) -> str:
        word = match.group(0)  # a long one (a path in an error) may break: the table must fit
        return f'<span class="nw">{word}</span>' if len(word) <= _NO_BREAK_MAX else word

    # the dot of "n2-highcpu-8 · rows=1000" (a --grid point) stays on its machine's line
    return re.sub(r"\S*\w-\S+", keep, html.escape(text)).replace(" · ", "\u00a0· ")


def _headlines(report: Report) -> list[str]:
    """The headlines; for many machines those about one left-out machine are folded."""
    from orchestrator.results.report.view import folded_headlines

    e = html.escape
    shown, folded = folded_headlines(report)
    out = ["<ul>", *(f"<li>{e(line)}</li>" for line in shown), "</ul>"]
    if folded:
        out += [f"<details><summary>{len(folded)} more headlines, one machine each</summary>"
                "<ul>", *(f"<li>{e(line)}</li>" for line in folded), "</ul></details>"]
    return out


def _answers(report: Report) -> list[str]:
    """The answer cards, side by side where the page is wide enough (stacked on a phone).

    For many machines the best few come first and the others are folded below them
    (``view.top_cards``), so the page reaches its figures without 200 cards to scroll."""
    from orchestrator.results.report.view import top_cards

    if not report.answers:
        return []
    top, ranked = top_cards(list(report.answers))
    out = ['<div class="answers">', *(line for card in top for line in _card(card)), "</div>"]
    rest = [card for card in ranked if card not in top]
    if rest:
        out += [f"<details><summary>{len(rest)} more answer cards, cheapest per unit first"
                '</summary><div class="answers">',
                *(line for card in rest for line in _card(card)), "</div></details>"]
    return out


def _card(card: Any) -> list[str]:
    e = html.escape
    out = [f'<section class="card"><h2>{e(card.title)}</h2><dl>']
    for label, text in card.lines():
        out.append(f'<dt>{e(label)}</dt>'
                   f'<dd class="{e(label.lower())}">{_no_break(text)}</dd>')
    out.append("</dl></section>")
    return out
