"""Long work shows how far it is: frames generated, bytes staged and MiB/s — not a spinner."""

from __future__ import annotations

import io
import os
import threading
from pathlib import Path

import pytest
from rich.console import Console

from orchestrator import providers
from orchestrator.engine.inputs import upload_inputs as _stage
from orchestrator.engine.progress import SweepProgress
from orchestrator.engine.sweep import StagedInputs, generate_inputs, plan_inputs
from orchestrator.spec.spec import SweepSpec
from workloads.inputs import InputSpec, ensure_inputs


def terminal() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=160, force_terminal=True, color_system=None), out


class Sent:
    """A progress callback that may be called from the writer or upload threads."""

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.lock = threading.Lock()

    def __call__(self, n: int) -> None:
        with self.lock:
            self.calls.append(n)


def test_input_generation_reports_each_frame_written(tmp_path: Path) -> None:
    seen = Sent()
    spec = InputSpec(frames=5, rows=30, cols=8)
    ensure_inputs(spec, tmp_path, on_frame=seen)
    assert sorted(seen.calls) == [1, 2, 3, 4, 5]
    ensure_inputs(spec, tmp_path, on_frame=seen)  # cached: nothing to count
    assert len(seen.calls) == 5


def test_the_sweep_shows_a_bar_of_frames_while_it_generates_inputs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLOUDPROF_CACHE", str(tmp_path / "cache"))
    spec = SweepSpec(repeats=1, machines=["n2-highcpu-2"], workload_params={"frames": 6, "rows": 30,
                                                                 "cols": 8})
    console, out = terminal()
    inputs = plan_inputs(spec)
    assert inputs is not None
    generate_inputs(inputs, console)
    text = out.getvalue()
    assert "Generating inputs" in text and "6/6" in text and "frames" in text
    again = plan_inputs(spec)
    assert again is not None
    console, out = terminal()
    generate_inputs(again, console)  # found in the cache: no bar
    assert "Generating inputs" not in out.getvalue() and again.local_dir == inputs.local_dir


def test_staging_reports_bytes_and_mib_per_second(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    sizes = {"a.parquet": 300_000, "b.parquet": 700_000}
    for name, size in sizes.items():
        (src / name).write_bytes(os.urandom(size))
    bucket = providers.open_bucket((tmp_path / "bucket").as_uri())
    # staged as a user's inputs=DIR is, without the frame checks (the bytes are random)
    inputs = StagedInputs("0123456789abcdef", sorted(sizes.items()), local_dir=src)
    console, out = terminal()
    with SweepProgress(console) as progress:
        _stage(bucket, inputs, progress)
    text = out.getvalue()
    assert "2 object(s) uploaded (1.0 MiB in" in text and " MiB/s), 0 already there" in text
    assert "0.0/1.0 MiB" not in text.splitlines()[-1]  # the bar ends full
    assert "1.0/1.0 MiB" in text
    console, out = terminal()
    with SweepProgress(console) as progress:
        _stage(bucket, inputs, progress)  # all there: nothing sent, no rate invented
    assert "0 object(s) uploaded (0.0 MiB in" in out.getvalue() and "MiB/s)" not in out.getvalue()


def test_each_bucket_reports_the_bytes_it_sends(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.bin").write_bytes(b"a" * 1000)
    (src / "sub" / "b.bin").write_bytes(b"b" * 234)
    bucket = providers.open_bucket((tmp_path / "bucket").as_uri())
    sent = Sent()
    bucket.upload_dir(src, "in", progress=sent)
    assert sum(sent.calls) == 1234
    again = Sent()
    bucket.upload_dir(src, "in", progress=again)
    assert again.calls == []  # skipped objects are not counted as sent


def test_s3_reports_bytes_as_they_are_sent(moto_env: object, tmp_path: Path) -> None:
    import boto3

    boto3.client("s3").create_bucket(Bucket="cp-progress")
    bucket = providers.open_bucket("s3://cp-progress")
    src = tmp_path / "src"
    src.mkdir()
    (src / "big.bin").write_bytes(os.urandom(9 * 2**20))  # multipart: several chunks
    (src / "small.bin").write_bytes(b"x" * 100)
    sent = Sent()
    bucket.upload_dir(src, "in", progress=sent)
    assert sum(sent.calls) == 9 * 2**20 + 100 and len(sent.calls) > 2


def test_gcs_reports_bytes_per_object(gcs_emulator: str, tmp_path: Path) -> None:
    import uuid

    from google.cloud import storage

    name = f"cp-progress-{uuid.uuid4().hex[:8]}"
    storage.Client().create_bucket(name)
    bucket = providers.open_bucket(f"gs://{name}")
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(b"a" * 5000)
    (src / "b.bin").write_bytes(b"b" * 70)
    sent = Sent()
    bucket.upload_dir(src, "in", progress=sent)
    assert sorted(sent.calls) == [70, 5000]
