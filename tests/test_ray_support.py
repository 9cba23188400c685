"""Ray as an optional extra: the check before a multi-node sweep, and its install on hosts.

Ray's absence is real, not simulated by a mock: an interpreter whose ``sys.path``
has no site-packages (``python -S``), or a fresh venv that never had it. The
install on a host goes through the real bootstrap over SSH to the loopback sshd
(``tests/fixtures/sshd.py``), with pip and the package index this machine has,
as ``test_remote``'s profiler bootstrap does.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from orchestrator.errors import EXIT_USAGE, UsageError
from orchestrator.providers.local import LocalExecutor
from orchestrator.providers.remote import RAY_REQUIREMENT, SshTarget, open_ssh
from orchestrator.ray_support import RAY_INSTALL_HINT, ray_available, require_ray

REPO = Path(__file__).resolve().parent.parent

# Runs require_ray the way the CLI shows a CloudprofError: one line, its exit code.
_CHECK = """
import sys
from orchestrator.ray_support import require_ray
from orchestrator.errors import CloudprofError
try:
    require_ray([int(n) for n in sys.argv[1].split(",")])
except CloudprofError as exc:
    print(f"error: {exc}", file=sys.stderr)
    sys.exit(exc.exit_code)
print("ray" in sys.modules)
"""


def _check(nodes: str, *, hide_site: bool) -> subprocess.CompletedProcess[str]:
    """``require_ray`` in a fresh interpreter; ``hide_site``: no site-packages on sys.path
    (``-S``), so Ray cannot be found while this checkout still can."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    flags = ["-S"] if hide_site else []
    return subprocess.run([sys.executable, *flags, "-c", _CHECK, nodes], env=env,
                          capture_output=True, text=True, timeout=120)


def test_asking_for_two_nodes_without_ray_is_one_line_saying_how_to_install_it() -> None:
    done = _check("1,2", hide_site=True)
    assert done.returncode == EXIT_USAGE
    assert done.stderr == "error: --nodes 2 needs Ray: pip install 'cloudprof[ray]'\n"
    assert done.stdout == ""


def test_one_node_needs_no_ray_and_the_check_never_imports_it() -> None:
    assert _check("1", hide_site=True).stdout == "False\n"
    with_ray = _check("1,2,4", hide_site=False)  # this venv has the [dev] extra: Ray
    assert with_ray.returncode == 0, with_ray.stderr
    assert with_ray.stdout == "False\n"  # found by find_spec, not imported (1.5 s)


def test_require_ray_names_the_largest_node_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", [str(REPO)])  # this process's own path, without Ray
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    assert not ray_available()
    with pytest.raises(UsageError, match=r"^--nodes 4 needs Ray"):
        require_ray([4, 1, 2])
    with pytest.raises(UsageError, match=r"^--nodes 2 needs Ray"):
        require_ray(2)  # the largest count alone
    require_ray([])  # no node dimension: one node
    require_ray(1)


def _venv(path: Path, *, pip: bool) -> Path:
    """A venv of this machine's base Python (which has no Ray); its python. Without
    ``pip``, a bare one: no pip of its own, and none from the base's site-packages."""
    flags = ["--system-site-packages"] if pip else ["--without-pip"]
    subprocess.run([sys.executable, "-m", "venv", *flags, str(path)], check=True,
                   capture_output=True, timeout=300)
    return path / "bin" / "python"


def test_local_host_without_ray_says_so_in_one_line(tmp_path: Path) -> None:
    host = LocalExecutor(tmp_path)
    assert host.ensure_ray() is None  # this checkout's interpreter: the [dev] extra has Ray
    host.python = str(_venv(tmp_path / "env-noray", pip=False))
    why = host.ensure_ray()
    assert why is not None and "\n" not in why
    assert why.startswith(f"ray is not importable by {host.python}")
    assert why.endswith(RAY_INSTALL_HINT)


@pytest.fixture
def ssh_host(sshd):
    target = SshTarget(sshd.host, sshd.port, sshd.user, sshd.client_key, [sshd.host_public])
    executor = open_ssh(target, timeout=20)
    yield executor
    executor.close()


@pytest.mark.slow
def test_ssh_hosts_get_ray_into_the_trial_env_once(sshd, ssh_host, tmp_path: Path) -> None:
    """A multi-node sweep's bootstrap: ``ray`` (the CLI ``ray start`` needs) and ``import
    ray`` in the env the trials use, installed the first time only — also when two nodes
    are one machine sharing the env and bootstrap at the same moment."""
    env = tmp_path / "env-test"
    python = str(_venv(env, pip=True))
    target = SshTarget(sshd.host, sshd.port, sshd.user, sshd.client_key, [sshd.host_public])
    second = open_ssh(target, timeout=20)
    try:
        ssh_host.python = second.python = python
        assert not (env / "bin" / "ray").exists()
        with ThreadPoolExecutor(2) as pool:
            assert list(pool.map(lambda host: host.ensure_ray(), [ssh_host, second])) == [
                None, None]
    finally:
        second.close()
    assert os.access(env / "bin" / "ray", os.X_OK)
    version = ssh_host.run([str(env / "bin" / "ray"), "--version"], timeout=120)
    assert version.exit_code == 0 and "ray, version 2." in version.stdout_tail
    assert ssh_host.ensure_ray() is None  # already there: nothing installed again
    log = (tmp_path / "bootstrap.log").read_text().splitlines()
    assert len(log) == 1 and log[0].endswith(f"ray {RAY_REQUIREMENT}")


def test_ssh_host_that_cannot_install_ray_says_why_in_one_line(ssh_host, tmp_path: Path) -> None:
    ssh_host.python = str(_venv(tmp_path / "env-nopip", pip=False))
    why = ssh_host.ensure_ray()
    assert why is not None and "\n" not in why
    assert why.startswith(f"cannot install {RAY_REQUIREMENT} on ")
    assert "No module named pip" in why
    assert not (tmp_path / "bootstrap.log").exists()
