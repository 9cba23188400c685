"""The sweep's input files: what it stages (known before anything is generated, for the
plan and budget), generated or found in the cache, and uploaded once to the bucket.
"""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.engine.progress import SweepProgress
from orchestrator.errors import UsageError
from orchestrator.providers.base import Bucket
from orchestrator.spec.spec import SweepSpec

if TYPE_CHECKING:
    from rich.console import Console


INPUT_PARAMS = {"frames": "frames", "rows": "rows", "cols": "cols", "seed": "seed",
                "format": "fmt"}


@dataclass
class StagedInputs:
    """The sweep's input files: where they are locally and under which bucket prefix."""

    hash: str
    files: list[tuple[str, int]]  # (path relative to the inputs dir, size) — predicted
    local_dir: Path | None = None  # set once generated/validated
    cube_spec: Any = None  # workloads.inputs.InputSpec when the sweep generates the inputs

    @property
    def prefix(self) -> str:
        return f"inputs/{self.hash}"

    @property
    def size(self) -> int:
        return sum(size for _, size in self.files)


def plan_inputs(spec: SweepSpec) -> StagedInputs | None:
    """What the sweep will stage, known before anything is generated (for the plan and budget).

    The cube workload's inputs are generated from its parameters (content-addressed
    by the spec's hash); ``inputs=DIR`` stages a user's own directory; any other
    workload stages nothing.
    """
    given = spec.workload_params.get("inputs")
    if given:
        directory = Path(str(given)).expanduser()
        if not directory.is_dir():
            raise UsageError(f"inputs: {directory} is not a directory")
        if spec.workload == "cube":  # what the cube would refuse on the VM, refused here
            _check_cube_inputs(directory, spec)
        files = sorted(p for p in directory.rglob("*") if p.is_file())
        listing = [(p.relative_to(directory).as_posix(), p.stat().st_size) for p in files]
        digest = hashlib.sha256()
        for p, (rel, size) in zip(files, listing, strict=True):
            digest.update(f"{rel}:{size}:{p.stat().st_mtime_ns}\n".encode())
        return StagedInputs(digest.hexdigest()[:16], listing, local_dir=directory)
    if spec.workload != "cube" or spec.command is not None:
        return None
    from workloads.base import WorkloadInputError
    from workloads.inputs import MANIFEST, InputSpec

    kwargs: dict[str, Any] = {}
    for param, attr in INPUT_PARAMS.items():
        if param in spec.workload_params:
            value = spec.workload_params[param]
            if attr != "fmt":
                try:
                    value = int(value)
                except (TypeError, ValueError):
                    raise UsageError(f"workload parameter {param} must be an integer, "
                                     f"got {value!r}") from None
            kwargs[attr] = value
    try:
        cube_spec = InputSpec(**kwargs)
    except WorkloadInputError as exc:
        raise UsageError(str(exc)) from None
    per_file = cube_spec.rows * cube_spec.cols * 8  # float64, uncompressed (an estimate)
    files = [(cube_spec.file_name(i), per_file) for i in range(cube_spec.frames)]
    files.append((MANIFEST, 200 * cube_spec.frames))
    return StagedInputs(cube_spec.hash, files, cube_spec=cube_spec)


def _check_cube_inputs(directory: Path, spec: SweepSpec) -> None:
    from workloads.base import WorkloadInputError
    from workloads.cube import CubeWorkload
    from workloads.inputs import check_inputs

    try:
        cube = CubeWorkload(**{k: str(v) for k, v in spec.workload_params.items()})
        check_inputs(directory, cube.dim)
    except WorkloadInputError as exc:
        raise UsageError(str(exc)) from None


def generate_inputs(inputs: StagedInputs, console: Console | None = None) -> Path:
    """Generate (or find in the cache) the inputs; the real file list replaces the predicted one.

    With a ``console``, a bar counts the frames written (generating large inputs takes
    minutes); found in the cache, nothing is shown.
    """
    if inputs.local_dir is None:
        from workloads.inputs import default_cache_dir, ensure_inputs, is_complete

        cube = inputs.cube_spec
        if console is None or is_complete(default_cache_dir() / cube.hash, cube):
            inputs.local_dir = ensure_inputs(cube)
        else:
            from orchestrator.engine.progress import counting

            with counting(console, "Generating inputs", cube.frames) as bar:
                inputs.local_dir = ensure_inputs(cube, on_frame=bar.set)
                bar.finish(f"frames, cached in {inputs.local_dir}")
    files = sorted(p for p in inputs.local_dir.rglob("*") if p.is_file())
    inputs.files = [(p.relative_to(inputs.local_dir).as_posix(), p.stat().st_size)
                    for p in files]
    return inputs.local_dir


def upload_inputs(bucket: Bucket, inputs: StagedInputs, progress: SweepProgress) -> None:
    """Upload the inputs with a bar of bytes and MiB/s; say what was sent and how fast."""
    progress.log(f"Staging inputs in {bucket.url}/{inputs.prefix}/ ...")
    bar = progress.transfer("staging inputs", inputs.size)
    sent = [0]
    lock = threading.Lock()

    def on_bytes(n: int) -> None:
        with lock:
            sent[0] += n
        if bar is not None:
            bar.add(n)

    started = time.monotonic()
    uploaded = bucket.upload_dir(inputs.local_dir, inputs.prefix, progress=on_bytes)
    seconds = time.monotonic() - started
    if bar is not None:
        bar.set(inputs.size)  # objects already there count as staged
        bar.finish("staged")
    rate = f" at {sent[0] / 2**20 / seconds:,.1f} MiB/s" if sent[0] and seconds > 0 else ""
    progress.log(f"  {len(uploaded)} object(s) uploaded ({sent[0] / 2**20:,.1f} MiB in "
                 f"{seconds:.1f} s{rate}), {len(inputs.files) - len(uploaded)} already there")
