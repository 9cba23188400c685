"""Estimates for the shipped machines an import does not price, fitted to the ones it does.

Where a source's rows were read one page at a time, some sizes of a family are
priced and others are not. Providers price a family linearly: GCP charges per
vCPU and per GiB, AWS per size step, so the unread sizes of a family in a region
follow from its read ones far better than from a remembered rate. Each such
row stays labelled an offline estimate and says what it was fitted to; a family
with no read row in the region keeps its remembered estimate.

Two fits, the closer one first: the same vCPU:GiB shape as read rows (a GCP
series, any AWS family) takes their median USD per vCPU-hour; otherwise, with
read rows of two or more shapes, a least-squares USD per vCPU-hour plus per
GiB-hour (numpy), kept only if both rates come out positive.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from statistics import median

from orchestrator.catalog.machines import MachineType


@dataclass(frozen=True)
class Fit:
    """A family's rates in one region and what they came from."""

    per_vcpu: float
    per_gib: float  # 0 for a same-shape fit
    rows: int
    how: str  # "median per vCPU of 4 rows", "least squares over 9 rows"

    def price(self, vcpus: float, gib: float) -> float:
        return self.per_vcpu * vcpus + self.per_gib * gib


def _fit(rows: list[tuple[float, float, float]], vcpus: float, gib: float) -> Fit | None:
    """Rates from (vCPUs, GiB, USD/h) rows for a machine of ``vcpus`` and ``gib``."""
    shape = gib / vcpus
    same = [price / v for v, g, price in rows if abs(g / v - shape) < 1e-6 * max(shape, 1)]
    if same:
        return Fit(median(same), 0.0, len(same), f"median per vCPU of {len(same)} "
                   f"row{'s' if len(same) != 1 else ''} of its shape")
    if len({round(g / v, 6) for v, g, _ in rows}) < 2:
        return None
    import numpy as np

    design = np.array([[v, g] for v, g, _ in rows])
    target = np.array([price for _, _, price in rows])
    (per_vcpu, per_gib), *_ = np.linalg.lstsq(design, target, rcond=None)
    if per_vcpu <= 0 or per_gib <= 0:
        return None
    return Fit(float(per_vcpu), float(per_gib), len(rows),
               f"least squares per vCPU and GiB over {len(rows)} rows")


@dataclass(frozen=True)
class Fitter:
    """The read rows of each (family, region), ready to price an unread machine."""

    by_group: dict[tuple[str, str], list[MachineType]]

    @classmethod
    def of(cls, imported: Iterable[MachineType]) -> Fitter:
        groups: dict[tuple[str, str], list[MachineType]] = {}
        for m in imported:
            groups.setdefault((m.family, m.region), []).append(m)
        return cls(groups)

    def prices(self, family: str, region: str, vcpus: float,
               gib: float) -> tuple[float, float | None, str, str] | None:
        """(on-demand, spot or None, how, the read rows' date) for an unread machine,
        or None without a fit."""
        rows = self.by_group.get((family, region), [])
        fit = _fit([(m.vcpus, m.memory_gib, m.price_on_demand) for m in rows
                    if m.price_on_demand], vcpus, gib)
        if fit is None:
            return None
        spot_fit = _fit([(m.vcpus, m.memory_gib, m.price_spot) for m in rows if m.price_spot],
                        vcpus, gib)
        on_demand = fit.price(vcpus, gib)
        spot = spot_fit.price(vcpus, gib) if spot_fit else None
        if spot is not None and spot > on_demand:
            spot = None
        rates = f"${fit.per_vcpu:.6f}/vCPU-h" + (
            f" + ${fit.per_gib:.6f}/GiB-h" if fit.per_gib else "")
        source = rows[0].price_source.split(" (", 1)[0]
        how = (f"fitted to {source} rows of {family} in {region} ({fit.how}: {rates}); "
               f"spot {'fitted likewise' if spot is not None else 'none listed'}")
        return on_demand, spot, how, rows[0].price_date
