"""What a report shows of the statistics: which group is best and whether the runner-up is
within noise, and one machine's spread, knee and USL fit as JSON.

Built from ``analysis.model``'s pure functions; here so that the model's module holds
the statistics and this one what a reader is told of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.analysis.model import (
    MIN_DISTINCT_WORKERS,
    N_BOOT,
    Comparison,
    Samples,
    _clean,
    _finite,
    _median,
    compare_groups,
    fit_usl_with_intervals,
    knee_range,
    spread,
    within_noise,
)


@dataclass(frozen=True)
class Ranking:
    """The best group, the runner-up, and whether they can be told apart."""

    best: Any
    runner_up: Any | None
    comparison: Comparison | None  # runner-up / best
    within_noise: bool

    def describe(self, name: Callable[[Any], str] = str) -> str:
        if self.runner_up is None:
            return f"{name(self.best)} (nothing to compare it with)"
        if self.within_noise:
            return f"{name(self.best)}; {name(self.runner_up)} is within noise of it"
        assert self.comparison is not None
        return f"{name(self.best)}, clearly ahead of {name(self.runner_up)}"


def rank(groups: Mapping[Any, Sequence[float]], higher_is_better: bool = True) -> Ranking | None:
    """Best and runner-up by median (e.g. (machine, workers) → units/s of each repeat).

    The headline uses this to say when the runner-up is within noise of the
    best instead of naming a winner that one more repeat could overturn.
    """
    meds = {k: _median(v) for k, v in groups.items() if _finite(v)}
    if not meds:
        return None
    order = sorted(meds, key=lambda k: meds[k], reverse=higher_is_better)
    best = order[0]
    if len(order) == 1:
        return Ranking(best, None, None, False)
    second = order[1]
    return Ranking(
        best=best,
        runner_up=second,
        comparison=compare_groups(groups[best], groups[second]),
        within_noise=within_noise(groups[best], groups[second]),
    )


def machine_confidence(
    samples: Samples, predict_at: Sequence[int] = (), n_boot: int = N_BOOT
) -> dict[str, Any]:
    """Everything the report shows for one machine, JSON-ready: spread per count, knee, USL.

    ``usl`` is None (with ``usl_reason``) when fewer than MIN_DISTINCT_WORKERS
    counts have a finite rate: a report must say why there is no curve.
    """
    data = _clean(samples)
    model = fit_usl_with_intervals(data, n_boot=n_boot)
    s = {n: spread(v) for n, v in data.items()}
    return {
        "spread": {str(n): sp.to_dict() for n, sp in s.items() if sp is not None},
        "knee": knee_range(data).to_dict(),
        "usl": model.to_dict(predict_at) if model is not None else None,
        "usl_reason": None
        if model is not None
        else f"needs at least {MIN_DISTINCT_WORKERS} worker counts with a result",
    }
