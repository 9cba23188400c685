"""cloudprof as a user installs it: ``python -m build``, then the wheel in a fresh venv.

An editable install reads everything through the checkout, so it hides any file
the package reads but does not ship (the catalog and the first-boot script were
read from ``infra/`` beside the package, which a wheel does not have). Here the
wheel is installed, not editable, into a venv outside the checkout and run from
an empty directory, with nothing pointing back at the checkout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.fixtures.once import built_once

ROOT = Path(__file__).resolve().parents[1]
# Variables that would let the installed command read the checkout instead of its package.
CHECKOUT_POINTERS = ("PYTHONPATH", "VIRTUAL_ENV", "CLOUDPROF_CATALOG_DIR")


def _run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> str:
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    assert proc.returncode == 0, f"{argv} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, str]]:
    """(venv, dist directory, environment): the built wheel installed with its dependencies,
    once per session (building and installing is ~30 s of CPU)."""
    env = {k: v for k, v in os.environ.items() if k not in CHECKOUT_POINTERS}
    env["COLUMNS"] = "200"
    with built_once(tmp_path_factory, "wheel") as (root, build):
        dist, venv = root / "dist", root / "venv"
        if build:
            _build_and_install(root, dist, venv, env)
    return venv, dist, env


def _build_and_install(root: Path, dist: Path, venv: Path, env: dict[str, str]) -> None:
    """The default build (the sdist, then the wheel built from that sdist, so a file the
    sdist lacks is missing from the wheel too), then the wheel into a venv of its own.

    Both with uv where ``make test`` put it beside this interpreter, as it installs the
    test extras (16 CPU-s with pip, 3 with uv, the same versions), else with pip. The
    installer is not what this checks: the wheel is."""
    uv = Path(sys.executable).with_name("uv")
    installer = ["--installer", "uv"] if uv.is_file() else []
    _run([sys.executable, "-m", "build", *installer, "--outdir", str(dist), str(ROOT)], root,
         env, 400)
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], root, env)
    (wheel,) = dist.glob("cloudprof-*.whl")
    python = str(venv / "bin" / "python")
    if uv.is_file():  # --no-cache: a temporary one (the session's $HOME has none to reuse)
        _run([str(uv), "pip", "install", "--quiet", "--no-cache", "--python", python,
              str(wheel)], root, env, 400)
    else:  # this interpreter's pip (the venv has none); --no-compile, as uv does not compile
        _run([sys.executable, "-m", "pip", "--python", python, "install", "--quiet",
              "--no-compile", str(wheel)], root, env, 400)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_build_makes_an_sdist_and_a_wheel_without_tests(
        installed: tuple[Path, Path, dict[str, str]]) -> None:
    _, dist, _ = installed
    (sdist,) = dist.glob("cloudprof-*.tar.gz")
    (wheel,) = dist.glob("cloudprof-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names if not n.startswith("cloudprof-")} == {
        "orchestrator", "workloads"}
    assert "orchestrator/_data/catalog/gcp.csv" in names
    assert "orchestrator/_data/startup.sh" in names
    for script in (ROOT / "infra" / "bootstrap").glob("*.sh"):  # the SSH bootstrap's
        assert f"orchestrator/_data/bootstrap/{script.name}" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    with tarfile.open(sdist) as tar:
        members = {m.name.split("/", 1)[1]: m for m in tar.getmembers() if "/" in m.name}
    for name in ("LICENSE", "CHANGELOG.md", "infra/startup.sh", "orchestrator/_data/startup.sh"):
        assert name in members, name
        assert members[name].isfile(), f"{name} is not a plain file in the sdist"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_installed_wheel_runs_from_an_empty_directory(
        installed: tuple[Path, Path, dict[str, str]], tmp_path: Path) -> None:
    venv, _, env = installed
    python, cloudprof = str(venv / "bin" / "python"), str(venv / "bin" / "cloudprof")
    where = json.loads(_run([python, "-c", (
        "import json, orchestrator, workloads\n"
        "from orchestrator.packaged import data_path\n"
        "print(json.dumps([orchestrator.__file__, workloads.__file__,"
        " str(data_path('catalog', 'gcp.csv')), str(data_path('startup.sh'))]))")],
        tmp_path, env))
    site = venv.resolve()
    for path in where:
        assert Path(path).resolve().is_relative_to(site), path
        assert not Path(path).resolve().is_relative_to(ROOT), path
    # The packaged files are copies of the checkout's infra/, not links into it.
    gcp_csv, startup = Path(where[2]), Path(where[3])
    assert not gcp_csv.is_symlink() and not startup.is_symlink()
    assert gcp_csv.read_bytes() == (ROOT / "infra" / "catalog" / "gcp.csv").read_bytes()
    assert startup.read_bytes() == (ROOT / "infra" / "startup.sh").read_bytes()

    listing = _run([cloudprof, "catalog"], tmp_path, env)
    assert "n2-highcpu-8" in listing and "c6i.large" in listing

    plan = _run([cloudprof, "sweep", "--machine", "n2-highcpu-8", "--plan"], tmp_path, env)
    assert "n2-highcpu-8" in plan and "Estimated wall time" in plan
    assert not (tmp_path / "runs").exists()  # --plan writes nothing

    out = _run([cloudprof, "sweep", "--machine", "n2-highcpu-8", "--dry-run", "--workers", "1",
                "--repeats", "1", "--duration", "1", "--frames", "4", "--rows", "100",
                "--cols", "100", "--dim", "20", "--sample-hz", "0"], tmp_path, env)
    assert "Report:" in out and "report.html" in out  # the sweep's last line
    (run,) = (tmp_path / "runs").iterdir()
    sweep = json.loads((run / "sweep.json").read_text())
    assert sweep["status"] == "done" and sweep["machines"]["n2-highcpu-8"]["status"] == "done"
    assert (run / "trials.parquet").is_file() and (run / "report.html").is_file()
