"""GPU figures: NVML per process and PyTorch's allocator peak (on a CUDA machine), and the
one line that says why there are none (everywhere else, CI included)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workloads import protocol
from workloads.profilers import torch_gpu
from workloads.profilers.hook import HOOK_DIR

ROOT = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024
HOLD_MIB = 8192  # large beside a CUDA context (~0.5 GiB), so NVML's figure is within 10 %


def run(out: Path, *args: str, env: dict[str, str] | None = None):
    full = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "workloads.run", "--out", str(out), "--quiet", *args],
        capture_output=True, text=True, timeout=300, env=full, check=False,
    )  # fmt: skip


def summary(out: Path) -> dict:
    return json.loads((out / protocol.SUMMARY_FILE).read_text())


def has_cuda() -> bool:
    probe = "import torch, pynvml; pynvml.nvmlInit(); assert torch.cuda.is_available()"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, check=False)
    return done.returncode == 0


def stand_in_torch(tmp_path: Path) -> Path:
    """A folder with a ``torch`` whose CUDA is initialised with a peak of 1000 + 2000 bytes."""
    fake = tmp_path / "fake"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text(
        "class cuda:\n"
        "    is_initialized = staticmethod(lambda: True)\n"
        "    device_count = staticmethod(lambda: 2)\n"
        "    max_memory_allocated = staticmethod(lambda d: (d + 1) * 1000)\n"
    )
    return fake


needs_gpu = pytest.mark.skipif(not has_cuda(), reason="needs torch, nvidia-ml-py and a CUDA GPU")


def test_without_nvml_the_summary_says_why_in_one_line_and_has_no_gpu_figures(tmp_path):
    blocker = tmp_path / "no_nvml"
    blocker.mkdir()
    (blocker / "pynvml.py").write_text("raise ImportError('NVML blocked for this test')\n")
    out = tmp_path / "t"
    # a small cube: the default one's 763 MiB of inputs took ~25 s to generate, for a note
    proc = run(out, "--workload", "cube", "--duration", "0.5", "--param", "frames=4",
               "--param", "rows=40", "--param", "cols=50", "--param", "dim=10",
               env={"PYTHONPATH": f"{blocker}{os.pathsep}{ROOT}"})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    s = summary(out)
    assert s["gpu"] is None
    note = s["gpu_note"]
    assert "\n" not in note and "nvidia-ml-py is not installed" in note
    import pyarrow.parquet as pq

    table = pq.read_table(out / protocol.TIMESERIES_FILE)
    assert table.column("gpu_proc_mem_bytes").null_count == table.num_rows


def test_a_command_job_under_the_runner_reports_its_torch_peak(tmp_path, monkeypatch):
    """The runner's whole path with a stand-in ``torch`` and a stand-in driver node."""
    fake = stand_in_torch(tmp_path)
    node = tmp_path / "nvidiactl"
    node.touch()
    site = tmp_path / "site"  # makes the runner see a driver: sitecustomize of the runner itself
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "from workloads.profilers import torch_gpu\n"
        f"torch_gpu.DRIVER_NODES = ({str(node)!r},)\n"
        "torch_gpu.hook_env.__defaults__ = (torch_gpu.DRIVER_NODES,)\n"
    )
    out = tmp_path / "c"
    proc = run(out, "--command", "--", sys.executable, "-c", "import torch, time; time.sleep(0.8)",
               env={"PYTHONPATH": os.pathsep.join([str(site), str(ROOT), str(fake)])})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    gpu = summary(out)["gpu"]
    assert gpu["torch_peak_allocated_bytes"] == 3000, gpu
    if "devices" not in gpu:  # no NVML here: the allocator's peak is the headline
        assert gpu["peak_mem_bytes"] == 3000 and gpu["peak_source"].startswith("PyTorch")


def test_the_command_hook_is_only_added_where_there_is_an_nvidia_driver(tmp_path):
    absent = torch_gpu.hook_env({"PYTHONPATH": "/job"}, tmp_path, (str(tmp_path / "x"),))
    assert absent == {"PYTHONPATH": "/job"}
    node = tmp_path / "nvidiactl"
    node.touch()
    present = torch_gpu.hook_env({"PYTHONPATH": "/job"}, tmp_path, (str(tmp_path / "x"), str(node)))
    assert present["PYTHONPATH"].split(os.pathsep) == [str(HOOK_DIR), "/job"]
    assert present[torch_gpu.ENV_FILE] == str(tmp_path / torch_gpu.PEAK_FILE)


def test_the_command_hook_reports_a_torch_jobs_allocator_peak_through_a_file(tmp_path):
    """A stand-in ``torch`` (CUDA initialised, a known peak): no GPU needed, the hook is real."""
    fake = stand_in_torch(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HOOK_DIR), str(fake)]),
           torch_gpu.ENV_FILE: str(tmp_path / torch_gpu.PEAK_FILE)}  # fmt: skip
    done = subprocess.run([sys.executable, "-c", "import torch"], env=env,
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert torch_gpu.read_hook_peak(tmp_path) == 3000  # both devices, written at exit


def test_the_command_hook_keeps_the_jobs_own_sitecustomize(tmp_path):
    own = tmp_path / "own"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import builtins\nbuiltins.JOB_SITE = 'loaded'\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HOOK_DIR), str(own)]),
           torch_gpu.ENV_FILE: str(tmp_path / torch_gpu.PEAK_FILE)}  # fmt: skip
    done = subprocess.run([sys.executable, "-c", "print(JOB_SITE)"], env=env,
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "loaded"
    assert not (tmp_path / torch_gpu.PEAK_FILE).exists()  # no torch imported: nothing to say


@needs_gpu
def test_a_torch_workloads_gpu_peak_is_in_the_summary_within_ten_percent(tmp_path):
    out = tmp_path / "w"
    proc = run(out, "--workload", "tests.fixtures.gpu_workloads:TorchHold",
               "--param", f"mb={HOLD_MIB}", "--duration", "3")  # fmt: skip
    _assert_the_hold_is_the_gpu_peak(proc, out, "workload")


@needs_gpu
def test_a_torch_command_jobs_gpu_peak_is_in_the_summary_within_ten_percent(tmp_path):
    out = tmp_path / "c"
    code = (
        "import time, torch\n"
        f"b = torch.empty({HOLD_MIB} * 2**20, dtype=torch.uint8, device='cuda'); b.fill_(1)\n"
        "torch.cuda.synchronize(); time.sleep(2.5)\n"
    )
    proc = run(out, "--command", "--", sys.executable, "-c", code)
    _assert_the_hold_is_the_gpu_peak(proc, out, "command")


def _assert_the_hold_is_the_gpu_peak(proc, out, what: str) -> None:
    """torch's allocator peak is the HOLD_MIB held (±1 %), NVML's within 10 % (its CUDA
    context on top)."""
    assert proc.returncode == 0, proc.stderr
    gpu = summary(out)["gpu"]
    want = HOLD_MIB * MIB
    assert abs(gpu["torch_peak_allocated_bytes"] - want) <= 0.01 * want, gpu
    assert abs(gpu["peak_mem_bytes"] - want) <= 0.1 * want, gpu
    print(f"{what} gpu:", json.dumps(gpu))
