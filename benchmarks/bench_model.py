"""How well the USL fit finds the peak, and how many trials ``--adaptive`` saves.

    python benchmarks/bench_model.py [--replays 100] [--seed 1] [--store runs/<id> ...]

Replays synthetic scaling surfaces with known truth: for each replay a machine
of v vCPUs (8, 16, 32, 64 or 96), a USL surface whose peak N* lies between
v/2 and 1.5 v (σ from 0 to 0.1; λ from 100 to 10,000 units/s) and run-to-run
noise of 2–5 % (Gaussian, a fraction of the rate, drawn per replay). A "trial"
draws one noisy throughput at one worker count.

1. **Fit on the default grid** (``planner.default_workers``: powers of two up
   to v, v, 2v) with 1 and 3 repeats: the error of the fitted N*, the share of
   replays within ±10 % (target: ≥ 90 % when ≥ 5 tested counts span the peak),
   and how often the 95 % interval holds the true N* (coverage).
2. **``--adaptive`` against the default grid** with 1 and 3 repeats, budget =
   the grid's trials (adaptive proposes one trial at a time and spends repeats
   only where they narrow N*): trials spent, share within ±10 %, share that
   stopped on the ±10 % rule (target: at most half the grid's trials for the
   same accuracy).
3. **Measured stores** (``--store``): each machine's fit, N* with its interval,
   fit quality and the knee's range — the project's own measurements replayed
   through the same functions.
4. **``--search`` over machine types** (only this with ``--search``): worlds of
   4 families × 7 sizes (4–96 vCPUs), each family with its own speed per
   worker (λ 700–1,400 units/s), USL σ (0–0.08) and peak N* (12–120 workers),
   price per vCPU-hour (0.02–0.06 USD) and memory per vCPU; a machine's
   measured peak is its true peak over 1..2v workers with 2–5 % noise. The
   search (``analysis.search.search_step``, budget ``default_budget`` = 3 spread
   over the 28 candidates plus ⌈√28⌉ = 6 the model picks) against as many
   machines as it tried, drawn at random (interleaved, same worlds): share of
   replays whose pick is within 5 % of the truly cheapest cost per unit
   (target ≥ 90 % with ≤ a third of the grid),
   machines tried, and the confidence reported. With ``--store``, stores with
   several machines are replayed too: each replay draws every machine's repeats
   with replacement, the search runs on those, and its pick is scored against
   the medians of all repeats.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np
from _common import machine_line, print_table

from orchestrator.analysis.model import (
    fit_usl,
    fit_usl_with_intervals,
    knee_range,
    peak_workers,
    usl,
)
from orchestrator.analysis.search import (
    Candidate,
    converged,
    default_budget,
    next_points,
    objective_value,
    peak_throughput,
    search_step,
    trials_spent,
)
from orchestrator.plan.planner import default_workers

VCPUS = (8, 16, 32, 64, 96)


def surfaces(replays: int, seed: int) -> list[dict[str, float]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(replays):
        v = int(rng.choice(VCPUS))
        sigma = float(rng.uniform(0.0, 0.1))
        n_star = float(v * rng.uniform(0.5, 1.5))
        out.append(
            {
                "v": v,
                "lam": float(rng.uniform(100, 10_000)),
                "sigma": sigma,
                "kappa": (1.0 - sigma) / n_star**2,
                "noise": float(rng.uniform(0.02, 0.05)),
            }
        )
    return out


def trial(s: dict[str, float], n: int, rng: np.random.Generator) -> float:
    return float(usl(n, s["lam"], s["sigma"], s["kappa"])) * (1.0 + rng.normal(0.0, s["noise"]))


def rel_error(estimate: float, truth: float) -> float:
    return abs(estimate - truth) / truth if math.isfinite(estimate) else math.inf


def grid_replay(s: dict[str, float], repeats: int, rng: np.random.Generator) -> dict[str, float]:
    grid = default_workers(int(s["v"]))
    samples = {n: [trial(s, n, rng) for _ in range(repeats)] for n in grid}
    truth = peak_workers(s["sigma"], s["kappa"])
    model = fit_usl_with_intervals(samples, n_boot=100)
    assert model is not None
    lo, hi = model.intervals["n_star"]
    return {
        "err": rel_error(model.fit.n_star, truth),
        "covered": float(lo <= truth <= hi),
        "spans": float(len(grid) >= 5 and min(grid) < truth < max(grid)),
        "trials": float(len(grid) * repeats),
    }


def adaptive_replay(
    s: dict[str, float], repeats: int, rng: np.random.Generator
) -> dict[str, float]:
    """One adaptive search, its budget the default grid's trials at ``repeats``."""
    v = int(s["v"])
    budget = len(default_workers(v)) * repeats
    measured: dict[int, list[float]] = {}
    while True:
        todo = next_points(measured, v, budget)
        if not todo:
            break
        for n in todo:
            measured.setdefault(n, []).append(trial(s, n, rng))
    truth = peak_workers(s["sigma"], s["kappa"])
    model = fit_usl_with_intervals(measured, n_boot=100)
    assert model is not None
    lo, hi = model.intervals["n_star"]
    return {
        "err": rel_error(model.fit.n_star, truth),
        "covered": float(lo <= truth <= hi),
        "stopped": float(converged(model)),
        "trials": float(trials_spent(measured)),
        "grid_trials": float(budget),
    }


def share(rows: list[dict[str, float]], key: str) -> float:
    return sum(r[key] for r in rows) / len(rows)


def within(rows: list[dict[str, float]], tol: float = 0.10) -> float:
    return sum(r["err"] <= tol for r in rows) / len(rows)


def pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def bench_grid(cases: list[dict[str, float]], seed: int) -> None:
    rows = []
    for repeats in (1, 3):
        rng = np.random.default_rng(seed + repeats)
        res = [grid_replay(s, repeats, rng) for s in cases]
        spanning = [r for r in res if r["spans"]]
        errs = sorted(r["err"] for r in res)
        rows.append(
            [
                repeats,
                len(res),
                len(spanning),
                pct(within(spanning)) if spanning else "–",
                f"{100 * errs[len(errs) // 2]:.1f}%",
                f"{100 * errs[int(0.9 * (len(errs) - 1))]:.1f}%",
                pct(share(res, "covered")),
            ]
        )
    print_table(
        ["repeats", "replays", "span the peak", "N* within ±10%", "median err", "p90 err",
         "95% CI holds N*"],
        rows,
        title="USL fit on the default grid (powers of two to v, v, 2v)",
    )


def bench_adaptive(cases: list[dict[str, float]], seed: int) -> None:
    rows = []
    for repeats in (1, 3):
        rng_a = np.random.default_rng(seed + 10 + repeats)
        rng_g = np.random.default_rng(seed + 20 + repeats)
        ada, grid = [], []
        for s in cases:  # interleaved: both methods see the same surfaces in the same order
            ada.append(adaptive_replay(s, repeats, rng_a))
            grid.append(grid_replay(s, repeats, rng_g))
        spent = sum(r["trials"] for r in ada)
        full = sum(r["grid_trials"] for r in ada)
        ratios = sorted(r["trials"] / r["grid_trials"] for r in ada)
        rows.append(
            [
                repeats,
                len(cases),
                f"{spent / len(ada):.1f}",
                f"{full / len(ada):.1f}",
                f"{spent / full:.2f} (p90 {ratios[int(0.9 * (len(ratios) - 1))]:.2f})",
                pct(within(ada)),
                pct(within(grid)),
                pct(share(ada, "stopped")),
                pct(share(ada, "covered")),
            ]
        )
    print_table(
        ["repeats", "replays", "adaptive trials", "grid trials", "adaptive/grid",
         "adaptive ±10%", "grid ±10%", "stopped on ±10%", "95% CI holds N*"],
        rows,
        title="--adaptive (start 1, v/4, v, 2v; budget = the grid's trials) vs the default grid",
    )


def bench_stores(stores: list[Path]) -> None:
    import pandas as pd

    rows = []
    for store in stores:
        trials = pd.read_parquet(store / "trials.parquet")
        trials = trials[trials["status"] == "ok"]
        for (machine, ran_on), group in trials.groupby(["machine", "ran_on"], sort=True):
            samples = {
                int(w): [float(u) for u in g["units_per_s"].dropna()]
                for w, g in group.groupby("workers")
            }
            model = fit_usl_with_intervals(samples)
            knee = knee_range(samples)
            if model is None:
                rows.append([store.name, machine, ran_on, "–", "–", "–", "too few counts",
                             knee.to_dict()["range95"]])
                continue
            lo, hi = model.intervals["n_star"]
            f = model.fit
            rows.append(
                [
                    store.name,
                    machine,
                    ran_on,
                    f"{f.sigma:.3f}/{f.kappa:.2g}",
                    f"{f.n_star:.1f} [{lo:.1f}–{hi:.1f}]",
                    f"{f.r2:.3f}",
                    f.verdict(),
                    f"{knee.workers} [{knee.low}–{knee.high}]",
                ]
            )
    print_table(
        ["store", "machine", "ran on", "σ/κ", "N* [95%]", "R²", "verdict", "knee [95%]"],
        rows,
        title="Measured stores",
    )


SEARCH_SIZES = (4, 8, 16, 32, 48, 64, 96)
SEARCH_FAMILIES = ("a", "b", "c", "d")


def search_world(rng: np.random.Generator) -> tuple[list[Candidate], dict[str, float]]:
    """Candidates and each one's true peak units/s (see the module docstring, part 4)."""
    cands, peak = [], {}
    for fam in SEARCH_FAMILIES:
        lam, per_vcpu = rng.uniform(700, 1400), rng.uniform(0.02, 0.06)
        mem = float(rng.choice([1, 2, 4, 8]))
        sigma, n_star = rng.uniform(0.0, 0.08), rng.uniform(12, 120)
        for v in SEARCH_SIZES:
            c = Candidate(f"{fam}-{v}", v, mem * v, fam, per_vcpu * v * rng.uniform(0.95, 1.05))
            cands.append(c)
            peak[c.name] = float(np.max(usl(np.arange(1, 2 * v + 1), lam, sigma,
                                            (1 - sigma) / n_star**2)))
    return cands, peak


def search_replay(cands: list[Candidate], draw, best_cost: dict[str, float],
                  rng: np.random.Generator, random_pick: int = 0) -> dict[str, float]:
    """One search (or ``random_pick`` machines drawn at random); ``draw(name)`` measures one."""
    budget = default_budget(len(cands))
    measured: dict[str, float] = {}
    step = None
    if random_pick:
        for i in rng.permutation(len(cands))[:random_pick]:
            measured[cands[i].name] = draw(cands[i].name)
    else:
        while (step := search_step(cands, measured, "cost", budget)).next is not None:
            measured[step.next] = draw(step.next)
    price = {c.name: c.price_per_hour for c in cands}
    pick = (step.pick if step else
            min(measured, key=lambda n: objective_value("cost", price[n], measured[n])))
    best = min(best_cost.values())
    return {
        "hit": float(best_cost[pick] <= 1.05 * best),
        "exact": float(best_cost[pick] == best),
        "tried": float(len(measured)),
        "grid": float(len(cands)),
        "confidence": step.confidence if step and step.confidence is not None else math.nan,
    }


def _noisy(peak: dict[str, float], noise: float, rng: np.random.Generator):
    return lambda name: peak[name] * (1 + rng.normal(0, noise))


def _search_row(label: str, res: list[dict[str, float]]) -> list[object]:
    conf = [r["confidence"] for r in res if math.isfinite(r["confidence"])]
    tried = sorted(r["tried"] for r in res)
    return [label, len(res), pct(share(res, "hit")), pct(share(res, "exact")),
            f"{np.mean(tried):.1f} (max {tried[-1]:.0f})", f"{res[0]['grid']:.0f}",
            f"{sum(tried) / sum(r['grid'] for r in res):.2f}",
            f"{np.mean(conf):.2f}" if conf else "–"]


def bench_search(replays: int, seed: int, stores: list[Path]) -> None:
    rows = []
    rng_w, rng_s, rng_r = (np.random.default_rng(seed + k) for k in (30, 31, 32))
    found, rand = [], []
    for _ in range(replays):  # interleaved: both methods see the same worlds in the same order
        cands, peak = search_world(rng_w)
        noise = rng_w.uniform(0.02, 0.05)
        cost = {c.name: objective_value("cost", c.price_per_hour, peak[c.name]) for c in cands}
        found.append(search_replay(
            cands, _noisy(peak, noise, rng_s), cost, rng_s))
        rand.append(search_replay(
            cands, _noisy(peak, noise, rng_r), cost, rng_r, int(found[-1]["tried"])))
    rows.append(_search_row("synthetic: --search (GP + EI)", found))
    rows.append(_search_row("synthetic: as many machines at random", rand))
    for store in stores:
        rows += _search_store(store, replays, seed)
    print_table(
        ["replays of", "replays", "pick within 5% of best cost/unit", "pick is the best",
         "machines tried (mean)",
         "candidates", "tried / grid", "confidence (mean)"],
        rows,
        title="--search cost over machine types (budget: 3 spread + sqrt(candidates) picks)",
    )


def _search_store(store: Path, replays: int, seed: int) -> list[list[object]]:
    """A measured store with several priced machines, replayed by resampling its repeats."""
    import json

    import pandas as pd

    sweep = json.loads((store / "sweep.json").read_text())
    trials = pd.read_parquet(store / "trials.parquet")
    trials = trials[trials["status"] == "ok"]
    cands, samples = [], {}
    for vm in sweep["plan"]["vms"]:
        m = vm["machine"]
        rows = trials[trials["machine"] == m["name"]]
        if rows.empty or not m.get("price_on_demand"):
            continue
        cands.append(Candidate(m["name"], int(m["vcpus"]), float(m["memory_gib"]),
                               m["family"], float(m["price_on_demand"])))
        samples[m["name"]] = {int(w): [float(u) for u in g["units_per_s"].dropna()]
                              for w, g in rows.groupby("workers")}
    if len(cands) < 3:
        return [[f"{store.name}: fewer than 3 priced machines", 0, "–", "–", "–", "–", "–", "–"]]
    cost = {c.name: objective_value("cost", c.price_per_hour, peak_throughput(samples[c.name]))
            for c in cands}
    rng = np.random.default_rng(seed + 40)

    def draw(name: str) -> float:
        resampled = {w: list(rng.choice(v, size=len(v))) for w, v in samples[name].items()}
        return peak_throughput(resampled) or 0.0

    res = [search_replay(cands, draw, cost, rng) for _ in range(replays)]
    return [_search_row(f"store {store.name}", res)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--replays", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--store", type=Path, action="append", default=[])
    ap.add_argument("--search", action="store_true",
                    help="only the --search replays (part 4), with --store's stores too")
    args = ap.parse_args()
    if args.search:
        print(machine_line())
        started = time.perf_counter()
        bench_search(args.replays, args.seed, args.store)
        print(f"({time.perf_counter() - started:.0f} s)")
        return 0
    print(machine_line())
    cases = surfaces(args.replays, args.seed)
    started = time.perf_counter()
    fit_usl({1: [1.0], 2: [1.9], 4: [3.5]})  # import scipy outside the figures
    if cases:  # --replays 0: only the measured stores
        bench_grid(cases, args.seed)
        bench_adaptive(cases, args.seed)
    if args.store:
        bench_stores(args.store)
    print(f"({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
