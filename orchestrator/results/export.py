"""Specs to deploy what a sweep measured: a Kubernetes Job, Ray options, a Dask worker line.

A sweep answers "how many workers, how much memory"; a user then writes those numbers
into a container spec or a scheduler's options by hand, and a short batch job is where
Kubernetes' own recommender sizes memory worst (it learns from a history the job does not
have). These builders take the figures the report already computed — the worker count
the answer card picked, and the memory request of ``report.memory`` (the whole-lifetime
peak plus the repeats' margin, rounded up) — and write them where each system reads
them. Each output names the run and the trials its figures came from.

A job whose memory kept growing (a "leak" verdict) has no memory request in the report,
and none here: every format needs a memory figure, and any fixed one is too small for a
longer run, so the export stops with one line naming the growth rate instead of writing
a limit that will kill the job later.

Pure functions from the report's model to a dict or text; ``cloudprof export`` prints them.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import string
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import UsageError
from orchestrator.formatting import fmt_bytes
from orchestrator.results.report.model import OK, RunData

FORMATS = ("k8s", "ray", "dask")
PLACEHOLDER_IMAGE = "REPLACE-WITH-YOUR-IMAGE"  # the job's image: cloudprof never built one
WORKDIR_IN_IMAGE = "/app"  # where the manifest expects the job's --workdir inside the image
LABEL_PREFIX = "cloudprof.dev"
MIB = 2**20


@dataclass(frozen=True)
class Measured:
    """One configuration of a run and the figures a deployment needs, with their source."""

    run_id: str
    machine: str  # the report's label ("n2-highcpu-8", or "n2-highcpu-8 · rows=1000")
    ran_on: str
    workers: int
    trial_ids: tuple[str, ...]  # the ok trials behind the figures
    peak_bytes: float
    request_bytes: int  # peak + margin, rounded up (``report.memory.memory_request``)
    margin_method: str
    command: list[str] | None  # the container's argv; None for a built-in workload
    command_text: str | None
    workdir: str | None
    workload: str

    def source(self) -> dict[str, Any]:
        """Where every figure came from, for each output to carry."""
        return {"run": self.run_id, "machine": self.machine, "ran_on": self.ran_on,
                "workers": self.workers, "trials": list(self.trial_ids),
                "peak_rss_bytes": math.ceil(self.peak_bytes),
                "memory_request_bytes": self.request_bytes, "margin": self.margin_method}


def measured(run: RunData, machine: str | None = None, workers: int | None = None) -> Measured:
    """The configuration to export: the given one, else the run's best by throughput.

    The worker count defaults to the one the machine's answer card picked; the machine to
    the card with the highest throughput (units/s, or the shortest time per run for a
    fixed-work job). Raises UsageError (one line) for a configuration the run lacks, a
    leaking one, or one without a measured peak.
    """
    from orchestrator.results.report.answer import answer_cards
    from orchestrator.results.report.memory import memory_rows

    cards = answer_cards(run)
    if not cards:
        raise UsageError(f"{run.run_dir}: no trial finished ok, so there is nothing to export")
    if machine is None:
        card = max(cards, key=_throughput)
    else:
        matching = [c for c in cards if machine in (c.machine, c.ran_on, _base(c.machine))]
        if not matching:
            names = ", ".join(sorted({c.machine for c in cards}))
            raise UsageError(f"{run.run_dir} has no ok trial on {machine!r}; it measured {names}")
        exact = [c for c in matching if c.machine == machine]
        if len(matching) > 1 and not exact:
            names = ", ".join(repr(c.machine) for c in matching)
            raise UsageError(f"--machine {machine!r} matches {names}; name one of them")
        card = (exact or matching)[0]
    count = card.workers if workers is None else int(workers)
    if count not in card.workers_tested:
        raise UsageError(f"{card.machine} has no ok trial at {count} workers; it measured "
                         f"{', '.join(map(str, card.workers_tested))}")
    rows = [r for r in memory_rows(run.trials) if (r["machine"], r["ran_on"], r["workers"]) ==
            (card.machine, card.ran_on, count)]
    if not rows:
        raise UsageError(f"{card.machine} at {count} workers has no measured peak memory, "
                         "so there is no memory figure to export")
    mem = rows[0]
    if mem["request_bytes"] is None:
        leak = mem["leak"] or {}
        rate = (f"{leak['slope_mb_per_s']:.1f} MB/s" if leak.get("slope_mb_per_s") is not None
                else "without bound")
        raise UsageError(
            f"{card.machine} at {count} workers leaks (memory grew {rate}, reaching "
            f"{fmt_bytes(mem['peak_rss_bytes'])}): any fixed memory limit is too small for a "
            "longer run, so none is exported; fix the leak or export a count that does not leak")
    all_trials = run.trials
    trials = all_trials[(all_trials["status"] == OK)
                        & (all_trials["machine"].astype(str) == card.machine)
                        & (all_trials["ran_on"].astype(str) == card.ran_on)
                        & (all_trials["workers"] == count)]
    ids = tuple(sorted(str(t) for t in trials["trial_id"] if t))
    grid = _grid(trials)
    spec = run.sweep.get("spec") or {}
    text = spec.get("command") if isinstance(spec.get("command"), str) else None
    argv = None
    if text:
        filled = _fill(text, {"workers": str(count), "vcpus": _vcpus(card.vcpus, count),
                              "trial": "deploy", "repeat": "0", **grid})
        argv = ["sh", "-c", filled] if spec.get("shell") else shlex.split(filled)
        text = filled
    workdir = spec.get("workdir")
    return Measured(
        run_id=run.name, machine=card.machine, ran_on=card.ran_on, workers=count,
        trial_ids=ids, peak_bytes=float(mem["peak_rss_bytes"]),
        request_bytes=int(mem["request_bytes"]), margin_method=str(mem["margin_method"]),
        command=argv, command_text=text, workdir=str(workdir) if workdir else None,
        workload=str(spec.get("workload") or "cube"))


def _throughput(card: Any) -> float:
    if card.fixed_work:
        s = card.seconds_per_run
        return 1.0 / s if s == s and s > 0 else -math.inf
    rate = card.units_per_s
    return rate if rate == rate else -math.inf


def _base(machine: str) -> str:
    return machine.split(" · ", 1)[0]


def _vcpus(vcpus: int | None, workers: int) -> str:
    return str(vcpus if vcpus is not None else workers)


def _grid(trials: Any) -> dict[str, str]:
    """The --grid point of the chosen trials, as the command's placeholders saw it."""
    for raw in trials.get("grid", ()):
        if isinstance(raw, str) and raw:
            try:
                values = json.loads(raw)
            except ValueError:
                continue
            if isinstance(values, dict):
                return {str(k): str(v) for k, v in values.items()}
    return {}


def _fill(text: str, values: dict[str, str]) -> str:
    """The command as it would run: placeholders the sweep filled per trial, filled once."""
    out = []
    for literal, field, _spec, _conv in string.Formatter().parse(text):
        out.append(literal)
        if field is not None:
            out.append(values.get(field, "{" + field + "}"))
    return "".join(out)


# ---------------------------------------------------------------- Kubernetes


def quantity(n_bytes: int) -> str:
    """A Kubernetes memory quantity: whole MiB as ``Mi``, else bytes (always ≥ ``n_bytes``)."""
    return f"{n_bytes // MIB}Mi" if n_bytes % MIB == 0 else str(n_bytes)


def _name(run_id: str) -> str:
    """A DNS-1123 name from the run id (lower case, ``-``, at most 63 characters)."""
    slug = re.sub(r"[^a-z0-9-]+", "-", run_id.lower()).strip("-")
    return ("cloudprof-" + slug)[:63].rstrip("-")


def _label(value: str) -> str:
    """A label value: at most 63 of [A-Za-z0-9-_.], starting and ending alphanumeric."""
    text = re.sub(r"[^A-Za-z0-9_.-]+", "-", value)[:63]
    return text.strip("-_.") or "none"


def k8s_job(m: Measured) -> dict[str, Any]:
    """A batch/v1 Job running the command once with what the trials measured.

    CPU: the worker count, requested and limited (each worker a core, as on the VM).
    Memory: the report's request — the whole-lifetime peak plus the repeats' margin — as
    both request and limit, so the scheduler reserves what the limit allows (a request
    below the limit lets the node overcommit and evict the job mid-run). The image is a
    placeholder: the job's files (its --workdir) must be in it at ``WORKDIR_IN_IMAGE``.
    """
    memory = quantity(m.request_bytes)
    resources = {"requests": {"cpu": str(m.workers), "memory": memory},
                 "limits": {"cpu": str(m.workers), "memory": memory}}
    container: dict[str, Any] = {"name": "job", "image": PLACEHOLDER_IMAGE,
                                 "resources": resources}
    if m.command is not None:
        container["command"] = m.command
        container["workingDir"] = WORKDIR_IN_IMAGE
    labels = {f"{LABEL_PREFIX}/run": _label(m.run_id),
              f"{LABEL_PREFIX}/workers": str(m.workers)}
    annotations = {
        f"{LABEL_PREFIX}/run": m.run_id,
        f"{LABEL_PREFIX}/trials": ",".join(m.trial_ids),
        f"{LABEL_PREFIX}/machine": m.machine,
        f"{LABEL_PREFIX}/peak-rss-bytes": str(math.ceil(m.peak_bytes)),
        f"{LABEL_PREFIX}/memory-margin": m.margin_method,
    }
    if m.workdir:
        annotations[f"{LABEL_PREFIX}/workdir"] = f"copy {m.workdir} to {WORKDIR_IN_IMAGE}"
    if m.command is None:
        annotations[f"{LABEL_PREFIX}/workload"] = (
            f"built-in workload {m.workload}: set the container's command yourself")
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": _name(m.run_id), "labels": labels, "annotations": annotations},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": labels},
                "spec": {"restartPolicy": "Never", "containers": [container]},
            },
        },
    }


def k8s_yaml(m: Measured) -> str:
    """``k8s_job`` as YAML, headed by comments saying what to set and where it came from."""
    head = [
        f"# cloudprof export: {m.machine} at {m.workers} workers, run {m.run_id}",
        f"# from trials {', '.join(m.trial_ids)}",
        f"# memory: peak {fmt_bytes(m.peak_bytes)} measured + margin ({m.margin_method}) = "
        f"{quantity(m.request_bytes)}",
        f"# set the image: {PLACEHOLDER_IMAGE} is a placeholder",
    ]
    return "\n".join([*head, *_yaml(k8s_job(m))]) + "\n"


_PLAIN_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9_./-]*$")


def _yaml(value: Any, indent: int = 0) -> list[str]:
    """Block-style YAML lines of a manifest (dicts, lists, strings, ints), without PyYAML:
    every string is double-quoted JSON, which YAML reads as the same string, so no value
    ("1", "on", "no") can change type on the way."""
    pad = "  " * indent
    lines: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            name = key if _PLAIN_KEY.match(key) else json.dumps(key)
            if isinstance(item, dict | list) and item:
                lines.append(f"{pad}{name}:")
                lines.extend(_yaml(item, indent + 1))
            else:
                lines.append(f"{pad}{name}: {_scalar(item)}")
    else:
        for item in value:
            if isinstance(item, dict | list) and item:
                nested = _yaml(item, indent + 1)
                lines.append(f"{pad}- {nested[0].lstrip()}")
                lines.extend(nested[1:])
            else:
                lines.append(f"{pad}- {_scalar(item)}")
    return lines


def _scalar(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, dict | list):
        return "{}" if isinstance(value, dict) else "[]"
    return json.dumps(str(value))


# ---------------------------------------------------------------- Ray and Dask


def ray_options(m: Measured) -> dict[str, Any]:
    """``ray.remote(**doc["options"])`` options (``num_cpus``, ``memory`` in bytes) and
    where they came from; Ray reserves ``memory`` for scheduling, so it is the request."""
    return {"options": {"num_cpus": m.workers, "memory": m.request_bytes},
            "source": m.source()}


def dask_worker(m: Measured, scheduler: str = "SCHEDULER_ADDRESS") -> str:
    """A ``dask worker`` line with the worker count as threads and the request as its
    memory limit, after a comment naming the trials."""
    line = shlex.join(["dask", "worker", scheduler, "--nthreads", str(m.workers),
                       "--memory-limit", str(m.request_bytes)])
    return (f"# cloudprof export: {m.machine} at {m.workers} workers, run {m.run_id}; "
            f"trials {', '.join(m.trial_ids)}; peak {fmt_bytes(m.peak_bytes)} + margin "
            f"({m.margin_method})\n{line}\n")


def render(m: Measured, fmt: str) -> str:
    """The text ``cloudprof export --format fmt`` prints."""
    if fmt == "k8s":
        return k8s_yaml(m)
    if fmt == "ray":
        return json.dumps(ray_options(m), indent=2) + "\n"
    if fmt == "dask":
        return dask_worker(m)
    raise UsageError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
