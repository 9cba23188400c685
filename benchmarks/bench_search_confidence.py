"""How often --search's stated confidence in its pick holds, over replays of known surfaces.

    python benchmarks/bench_search_confidence.py [--replays 500] [--seed 7]

``--search`` ends by saying how sure it is that its pick is the best candidate,
tried or not ("P(the pick is the best)": ``analysis.search.search_step``'s
``confidence``). A stated 80 % is worth reading only if, of the searches that
say 80 %, about 80 % picked the best. Each replay draws a world of machines
with a known cheapest cost per unit (``bench_model.search_world``: 4 families
× 7 sizes, 2-5 % run-to-run noise), runs the search to its end, and records
the confidence it stated and whether its pick truly was the cheapest.

The replays are binned by stated confidence; each bin gives the mean stated
figure, the share of its replays whose pick was the best, with a 95 % Wilson
interval for that share. Beside the confidence as stated, the same replays are
scored with the Gaussian process's own posterior (before calibration: the
tried machines as uncertain as the fitted noise share says), which is what
``search_step`` stated until the pinned draw (``analysis.search._pinned``).
The summary gives each one's mean stated figure against the share observed,
the Brier score and the expected calibration error (the bins' |stated −
observed|, weighted by their replays).
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np
from _common import machine_line, print_table
from bench_model import _noisy, search_world

from orchestrator.analysis import search as S

BINS = (0.0, 0.5, 0.7, 0.8, 0.9, 0.95, 1.0)


def replay(rng_w: np.random.Generator, rng_s: np.random.Generator) -> dict[str, float]:
    """One search to its end on a fresh world; what it stated, and before calibration."""
    cands, peak = search_world(rng_w)
    draw = _noisy(peak, rng_w.uniform(0.02, 0.05), rng_s)
    cost = {c.name: S.objective_value("cost", c.price_per_hour, peak[c.name]) for c in cands}
    measured: dict[str, float] = {}
    budget = S.default_budget(len(cands))
    while (step := S.search_step(cands, measured, "cost", budget)).next is not None:
        measured[step.next] = draw(step.next)
    assert step.pick is not None and step.confidence is not None
    names = [c.name for c in cands]
    tried = [n for n in names if n in measured]
    mean, cov = S._posterior(S._features(cands), names, tried, measured, cands, S.SEED)
    before = S._confidence(S._offsets(cands, "cost"), mean, cov, names.index(step.pick), S.SEED)
    return {"stated": step.confidence, "before": before,
            "best": float(cost[step.pick] == min(cost.values()))}


def _share_ci(hits: int, n: int) -> str:
    from scipy.stats import binomtest

    ci = binomtest(hits, n).proportion_ci(method="wilson")
    return f"{ci.low:.0%}–{ci.high:.0%}"


def binned(stated: np.ndarray, best: np.ndarray) -> tuple[list[list[object]], float]:
    """One row per non-empty bin of stated confidence, and the expected calibration error."""
    rows, ece = [], 0.0
    for lo, hi in itertools.pairwise(BINS):
        inside = (stated >= lo) & ((stated < hi) if hi < 1.0 else (stated <= hi))
        n = int(inside.sum())
        if not n:
            continue
        said, seen = float(stated[inside].mean()), float(best[inside].mean())
        ece += n / len(stated) * abs(said - seen)
        rows.append([f"{lo:.0%}–{hi:.0%}", n, f"{said:.0%}", f"{seen:.0%}",
                     _share_ci(int(best[inside].sum()), n)])
    return rows, ece


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--replays", type=int, default=500)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    print(machine_line())
    started = time.perf_counter()
    rng_w, rng_s = np.random.default_rng(args.seed), np.random.default_rng(args.seed + 1)
    res = [replay(rng_w, rng_s) for _ in range(args.replays)]
    best = np.array([r["best"] for r in res])
    headers = ["stated P(best)", "replays", "stated (mean)", "pick was the best",
               "95% interval"]
    summary = []
    for key, label in (("stated", "as stated (pinned to what was measured)"),
                       ("before", "the GP's own posterior (before calibration)")):
        stated = np.array([r[key] for r in res])
        rows, ece = binned(stated, best)
        print_table(headers, rows, title=f"--search cost, confidence {label}: "
                    f"{args.replays} replays of 28-machine worlds")
        summary.append([label, f"{stated.mean():.0%}", f"{best.mean():.0%}",
                        round(float(np.mean((stated - best) ** 2)), 3), round(ece, 3)])
    print_table(["confidence", "stated (mean)", "pick was the best", "Brier score",
                 "calibration error"], summary,
                title="Stated against observed, all replays (lower Brier and error: better)")
    print(f"({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
