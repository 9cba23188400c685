"""The SSH bootstrap's shell scripts (``infra/bootstrap/*.sh``, packaged like the startup
script: ``orchestrator.packaged``) and the packages they install on a host."""

from __future__ import annotations

from orchestrator.packaged import data_path
from orchestrator.ray_support import RAY_FOUND_CHECK


def _script(name: str) -> str:
    return data_path("bootstrap", name).read_text()


# Both scripts below start with this: it marks the env in use and removes the envs of
# older wheels that no sweep used for a week (and half-built ones a day old), so a host
# that sees many cloudprof versions does not fill up. $1 workdir, $2 env dir.
ENV_RETENTION_DAYS = 7
_PRUNE_FUNCTION = _script("prune.sh").replace("__DAYS__", str(ENV_RETENTION_DAYS))

# Positional parameters: $1 workdir, $2 env dir, $3 hash, $4 startup state dir.
# Waits for a running first-boot script (it installs python3-venv/pip), then
# exits 0 when the env for this hash imports workloads and its dependencies.
_REUSE_SCRIPT = _PRUNE_FUNCTION + _script("reuse.sh")

# A Debian/Ubuntu image's python3 cannot make a venv until python3-venv is installed; a
# cloud VM's first-boot script installs it, an SSH host (a VM the user made, a login
# user with passwordless sudo as cloud images have) may lack it: install it with apt
# when root or sudo without a password allows, else say what to install. $1 workdir,
# $2 base python.
_APT_VENV_FUNCTION = _script("apt_venv.sh")

# $1 workdir, $2 env dir, $3 hash, $4 wheel path, $5 base python, $6 the directory of
# staged wheels (optional: orchestrator.providers.wheelhouse). Builds the env beside its
# final name and renames it, so a half-built env is never taken for a good one
# (and two sweeps bootstrapping one host at once do not trip over each other).
_INSTALL_SCRIPT = _PRUNE_FUNCTION + _APT_VENV_FUNCTION + _script("install.sh")


# --profile's tools, installed into the trial env only when a sweep asks for them. The
# probe is a command that succeeds when the tool is already there ($2 = the env's bin).
PROFILER_PACKAGES = {
    "cpu": ("py-spy>=0.4", 'test -x "$2/py-spy"'),
    "gil": ("py-spy>=0.4", 'test -x "$2/py-spy"'),
    "memory": ("memray>=1.11", '"$1" -c "import memray"'),
}
# Ray for multi-node sweeps (pyproject's ``ray`` extra): plain ray, not ray[default]
# (no dashboard, no extra servers on the nodes). The nodes of one sweep install it
# together from the same index, so they get one version, as a Ray cluster needs.
RAY_REQUIREMENT = "ray>=2.9"
_RAY_PROBE = f'test -x "$2/ray" && "$1" -c "{RAY_FOUND_CHECK}"'
# $1 env python, $2 env bin dir, $3 probe, $4 pip requirement, $5 what it is (for the log).
# Two "hosts" may be one machine sharing one env (ssh hosts on one box, the tests' loopback
# nodes): installs into an env take its lock (flock, where there is one), and look again
# once they hold it, so the second finds the first's install instead of racing it.
_PACKAGE_SCRIPT = _script("package.sh")


