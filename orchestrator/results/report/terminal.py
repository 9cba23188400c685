"""The report in a terminal, with rich, laid out for the console's width.

rich shrinks a table that is too wide by folding its cells, which splits
numbers and words (``$0.37`` over two lines reads as ``$0.3`` and ``7``). Here
the layout is decided before rich sees the table: every column gets at least
its longest unbreakable piece (a whole number with its unit, or the longest
word of a text), the columns least needed are left out (and the report says
which) until the rest fits, and when even the essential ones do not fit each
row is printed as a stacked list of "header value" lines. Text cells still wrap,
but only between words.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table as RichTable

    from orchestrator.results.report.answer import AnswerCard
    from orchestrator.results.report.tables import Report, Table


_ROW_STYLE = {"failed": "red", "oversubscribed": "yellow", "pareto": "bold green"}

_NUMERIC = frozenset(
    {"workers", "n", "units/s", "per vCPU", "eff.", "peak RSS", "CPU", "vCPUs", "trials", "repeat",
     "ratio", "range", "load peak", "trial peak", "runs/h", "time/run"}
)  # fmt: skip

DROP_ORDER = (
    "measured by",
    "margin",
    "range",
    "per vCPU",
    "leak",
    "CPU",
    "n",
    "ran on",
    "eff.",
    "VM time",
    "est. time",
    "where",
    "$/hour",
    "workers tested",
    "vCPUs",
    "trial",
    "repeat",
    "peak RSS",
    "trials",
)
"""Columns a narrow terminal leaves out, first to last; the others are never left out
(report.md and ``--json`` always hold every column)."""

_SHORT = 16  # a cell that starts like a number and is at most this long is never wrapped


@dataclass(frozen=True)
class Layout:
    """Which columns of a table are shown and how wide, or ``stacked`` when none fits."""

    columns: tuple[int, ...]  # indexes into the table's headers
    widths: tuple[int, ...]  # content width of each shown column
    dropped: tuple[str, ...] = ()
    stacked: bool = False


def render_console(report: Report, console: Console) -> None:
    """Answer cards, headlines, then each table laid out for ``console.width`` (see the
    module's docstring); a sweep of many machines is cut to its best (``view.TerminalView``)."""
    from orchestrator.results.report.view import terminal_view

    view = terminal_view(report)
    console.print(f"[bold]{_rich_escape(report.title)}[/bold]")
    for card in view.cards:
        print_card(card, console)
    for line in view.headlines:
        console.print(f"• {_rich_escape(line)}")
    if view.hidden:
        console.print(f"[dim]{_rich_escape(view.note())}[/dim]")
    for table in view.tables:
        print_table(table, console)
        console.print()


def print_card(card: AnswerCard, console: Console) -> None:
    """One answer card in a box: its labels in a narrow column, the texts wrapped between words."""
    from rich.panel import Panel
    from rich.table import Table as RichTable

    grid = RichTable.grid(padding=(0, 1))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    for label, text in card.lines():
        grid.add_row(_rich_escape(label), _rich_escape(text))
    from rich.cells import cell_len
    from rich.console import Group
    from rich.text import Text

    title = f"[bold]{_rich_escape(card.title)}[/bold]"
    if cell_len(card.title) + 6 <= console.width:  # in the top border
        console.print(Panel(grid, title=title, title_align="left", border_style="green",
                            expand=False))
    else:  # a border cuts a long title short ("rows=2000" of rows=20000): inside, wrapped
        heading = Text(card.title, style="bold")
        console.print(Panel(Group(heading, grid), border_style="green", expand=False))


def print_table(table: Table, console: Console, rules: bool = False) -> None:
    """One table fitted to the console (columns left out and named, or rows stacked), its notes.

    ``rules`` draws vertical lines between the columns (compare's few wide text columns
    read better with them); the report's many narrow columns go without.
    """
    layout = fit(table, console.width, rules)
    if layout.stacked:
        _print_stacked(table, console)
    else:
        console.print(_rich_table(table, layout, rules))
    if layout.dropped:
        left_out = _rich_escape(", ".join(layout.dropped))
        console.print(
            f"[dim]Left out at {console.width} columns: {left_out} "
            "(a wider terminal, report.md or --json show them).[/dim]"
        )
    for note in table.notes:
        console.print(f"[dim]{_rich_escape(note)}[/dim]")


def _numeric(header: str) -> bool:
    return header in _NUMERIC or header.startswith("$")


def unbreakable(cell: str, numeric: bool) -> bool:
    """Whether a cell must stay on one line: a number, or a short text that starts like one."""
    return numeric or (cell[:1] in "0123456789$–-" and len(cell) <= _SHORT)


def _words_width(text: str) -> int:
    from rich.cells import cell_len

    return max((cell_len(word) for word in text.split()), default=0)


def column_widths(table: Table) -> list[tuple[int, int]]:
    """(minimum, natural) width per column: its widest unbreakable piece, its widest cell."""
    from rich.cells import cell_len

    out = []
    for i, header in enumerate(table.headers):
        numeric = _numeric(header)
        cells = [row.cells[i] for row in table.rows]
        minimum = max(
            [_words_width(header), 1]
            + [cell_len(c) if unbreakable(c, numeric) else _words_width(c) for c in cells]
        )
        natural = max([cell_len(header), 1] + [cell_len(c) for c in cells])
        out.append((minimum, natural))
    return out


def fit(table: Table, width: int, rules: bool = False) -> Layout:
    """The columns shown and their widths so the table is at most ``width`` cells wide."""
    sizes = column_widths(table)
    shown = list(range(len(table.headers)))
    droppable = [table.headers.index(h) for h in DROP_ORDER if h in table.headers]
    while True:
        room = width - _overhead(len(shown), rules)
        need = sum(sizes[i][0] for i in shown)
        if need <= room:
            break
        if not droppable:
            return Layout(columns=(), widths=(), stacked=True)
        shown.remove(droppable.pop(0))
    widths = [sizes[i][0] for i in shown]
    spare = room - need
    wants = [sizes[i][1] - sizes[i][0] for i in shown]
    if sum(wants) <= spare:
        widths = [sizes[i][1] for i in shown]
    else:  # share the spare room in proportion to what each column lacks
        for k, want in enumerate(wants):
            widths[k] += want * spare // sum(wants)
    dropped = tuple(h for i, h in enumerate(table.headers) if i not in shown)
    return Layout(columns=tuple(shown), widths=tuple(widths), dropped=dropped)


def _new_rich_table(title: str | None, rules: bool = False) -> RichTable:
    """Compact: no vertical rules, one space between columns (or rich's ruled box)."""
    from rich import box
    from rich.table import Table as RichTable

    if rules:
        return RichTable(title=title, box=box.HEAVY_HEAD)
    return RichTable(
        title=title,
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
        title_justify="left",
        title_style="bold",
    )


_OVERHEAD: dict[tuple[int, bool], int] = {}


def _overhead(n_columns: int, rules: bool = False) -> int:
    """Cells a table of ``n_columns`` takes beyond its columns' content (edges, gaps), measured."""
    key = (n_columns, rules)
    if key not in _OVERHEAD:
        from rich.console import Console
        from rich.measure import Measurement

        probe = _new_rich_table(None, rules)
        for _ in range(n_columns):
            probe.add_column(width=1)
        console = Console(width=10_000)
        total = Measurement.get(console, console.options, probe).maximum
        _OVERHEAD[key] = total - n_columns
    return _OVERHEAD[key]


def _rich_table(table: Table, layout: Layout, rules: bool = False) -> RichTable:
    rich_table = _new_rich_table(table.title, rules)
    for i, width in zip(layout.columns, layout.widths, strict=True):
        header = table.headers[i]
        rich_table.add_column(
            _rich_escape(header),
            justify="right" if _numeric(header) else "left",
            width=width,
            overflow="fold",  # only a word longer than the whole terminal is ever folded
        )
    for row in table.rows:
        rich_table.add_row(
            *(_rich_escape(row.cells[i]) for i in layout.columns), style=_style(row.flags)
        )
    return rich_table


def _print_stacked(table: Table, console: Console) -> None:
    """One block per row: its first cell as a heading, then "header  value" lines."""
    from rich.padding import Padding
    from rich.table import Table as RichTable

    console.print(f"[bold]{_rich_escape(table.title)}[/bold]")
    for row in table.rows:
        grid = RichTable.grid(padding=(0, 1))
        grid.add_column(style="dim", no_wrap=True)
        grid.add_column(overflow="fold")
        for header, cell in zip(table.headers[1:], row.cells[1:], strict=True):
            grid.add_row(_rich_escape(header), _rich_escape(cell))
        console.print(_rich_escape(row.cells[0]), style=_style(row.flags) or "bold")
        console.print(Padding(grid, (0, 0, 1, 2)), style=_style(row.flags))


def _style(flags: frozenset[str]) -> str | None:
    return next((s for f, s in _ROW_STYLE.items() if f in flags), None)


def _rich_escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)
