"""Machine types and their prices, from the CSV files in ``infra/catalog/``.

Prices carry their source and date: a sweep copies the rows it used into its
results, so an old report keeps the costs it was made with.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MachineType:
    provider: str  # "gcp" | "aws" | "ssh" | "local"
    name: str
    family: str
    vcpus: int
    memory_gib: float
    region: str
    price_on_demand: float | None  # USD per hour
    price_spot: float | None
    price_source: str
    price_date: str  # ISO date

    def price(self, spot: bool) -> float | None:
        return self.price_spot if spot else self.price_on_demand
