"""What a terminal shows of a report of many machines: the best few, ranked.

A sweep of 200 machines makes 200 answer cards and tables of 1,200 rows: in a terminal
they scroll past unread (and took seconds to lay out). Up to ``TERMINAL_MACHINES``
machines every renderer shows everything; beyond, the terminal prints the answer cards of
the best few and the tables' rows of the best ``TERMINAL_MACHINES`` in rank order, and
says where the rest are; report.html shows the same cards first and folds the others;
report.md and ``--json`` hold every card and row.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.results.report.answer import AnswerCard
    from orchestrator.results.report.tables import Report, Table


TERMINAL_CARDS = 3
"""Answer cards a terminal prints when a sweep has more than ``TERMINAL_MACHINES``
machines: the cheapest per unit (the fastest added when it is not among them)."""
TERMINAL_MACHINES = 10
"""Machines whose rows a terminal prints, ranked; report.md and report.html hold all."""


@dataclass(frozen=True)
class TerminalView:
    """What a terminal prints of a report: all of it up to ``TERMINAL_MACHINES``
    machines; beyond, the answer cards of the best few and the tables' rows of the best
    ``TERMINAL_MACHINES`` in rank order. 200 cards and 1,200-row tables scroll past
    unread (and took seconds to lay out); the files keep every machine."""

    cards: list[AnswerCard]
    headlines: list[str]
    tables: list[Table]
    machines: int  # the report's machines (answer cards)
    hidden: int  # machines left out of the tables

    def note(self) -> str:
        shown = self.machines - self.hidden
        return (f"{shown} of {self.machines} machines shown, cheapest per unit first "
                f"(the fastest among them); the other {self.hidden} are in report.md and "
                "report.html (every card and row), and in report --json.")


def _rank_key(card: AnswerCard) -> tuple[float, float]:
    cost = card.cost_per_million_units
    return (cost if cost == cost else float("inf"), -_finite_or(card.units_per_s, -1.0))


def _finite_or(value: float, default: float) -> float:
    return value if value == value and abs(value) != float("inf") else default


def top_cards(cards: list[AnswerCard]) -> tuple[list[AnswerCard], list[AnswerCard]]:
    """(the cards shown first, every card ranked): all of them up to
    ``TERMINAL_MACHINES``; beyond, the ``TERMINAL_CARDS`` cheapest per unit, with the
    fastest when it is not among them. report.html shows these first, the others folded."""
    ranked = sorted(cards, key=_rank_key)
    if len(cards) <= TERMINAL_MACHINES:
        return list(cards), ranked
    fastest = max(cards, key=lambda c: _finite_or(c.units_per_s, -1.0))
    top = ranked[:TERMINAL_CARDS]
    return top + ([fastest] if fastest not in top else []), ranked


def folded_headlines(report: Report) -> tuple[list[str], list[str]]:
    """(the headlines shown, those folded): past ``TERMINAL_MACHINES`` machines, the lines
    about one machine whose card is not among ``top_cards`` are folded (report.html)."""
    from orchestrator.results.report.model import machine_label

    cards = list(report.answers)
    if len(cards) <= TERMINAL_MACHINES:
        return list(report.headlines), []
    top, _ = top_cards(cards)
    labels = {machine_label(c.machine, c.ran_on) for c in cards}
    hidden = labels - {machine_label(c.machine, c.ran_on) for c in top}
    shown = headlines_shown(report.headlines, labels, hidden)
    kept = set(shown)
    return shown, [line for line in report.headlines if line not in kept]


def terminal_view(report: Report) -> TerminalView:
    """The report as a terminal prints it (see ``TerminalView``)."""
    from orchestrator.results.report.model import machine_label

    cards = list(report.answers)
    if len(cards) <= TERMINAL_MACHINES:
        return TerminalView(cards, list(report.headlines), list(report.tables), len(cards), 0)
    top, ranked = top_cards(cards)
    chosen = ranked[:TERMINAL_MACHINES] + [c for c in top if c not in
                                           ranked[:TERMINAL_MACHINES]]
    rank = {machine_label(c.machine, c.ran_on): i for i, c in enumerate(chosen)}
    labels = {machine_label(c.machine, c.ran_on) for c in cards}
    hidden = labels - set(rank)
    return TerminalView(top, headlines_shown(report.headlines, labels, hidden),
                        [_ranked_rows(t, rank) for t in report.tables], len(cards), len(hidden))


def headlines_shown(lines: list[str], labels: set[str], hidden: set[str]) -> list[str]:
    """The headlines less those about one machine the terminal leaves out ("Scaling stops
    for ..."); a line that names several (best and runner-up) or none stays."""
    import re

    if not hidden:
        return lines
    pattern = re.compile("|".join(rf"(?<![\w.-]){re.escape(label)}(?![\w.-])"
                                  for label in sorted(labels, key=len, reverse=True)))
    kept = []
    for line in lines:
        named = set(pattern.findall(line))
        if len(named) != 1 or not named <= hidden:
            kept.append(line)
    return kept


def _ranked_rows(table: Table, rank: dict[str, int]) -> Table:
    """A per-machine table's rows of the ranked machines, in rank order (a table not per
    machine is kept whole)."""
    if not table.headers or table.headers[0] != "machine":
        return table
    rows = [row for row in table.rows if row.cells and row.cells[0] in rank]
    rows.sort(key=lambda row: rank[row.cells[0]])  # stable: the table's order per machine
    left = len(table.rows) - len(rows)
    if not left or not rows:  # all shown, or a table that names its machines otherwise
        return table
    note = f"{left} more rows, of the machines not shown, in report.md and report.html."
    return replace(table, rows=rows, notes=[*table.notes, note])
