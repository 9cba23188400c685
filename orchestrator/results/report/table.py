"""A table of strings, as every renderer (terminal, Markdown, HTML) draws it.

Its own module, imported by every module that builds a table (``tables``, ``jobs``,
``memory``, ``limits``) and importing none of them, so they form no import circle.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Row:
    cells: list[str]
    flags: frozenset[str] = frozenset()  # "oversubscribed", "estimate", "pareto", "failed"


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[Row]
    notes: list[str] = field(default_factory=list)
