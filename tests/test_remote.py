"""Remote execution against a real OpenSSH sshd on loopback (tests/fixtures/sshd.py).

No paramiko mocks: every test logs in to a real sshd, which is what a VM runs.
"""

from __future__ import annotations

import os
import re
import shlex
import stat
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest

from orchestrator.errors import (
    ConnectionLostError,
    HostKeyError,
    RemoteCommandError,
    UnreachableError,
    UsageError,
)
from orchestrator.providers import remote
from orchestrator.providers.base import Instance
from orchestrator.providers.remote import (
    ENV_RETENTION_DAYS,
    SshKeys,
    SshTarget,
    build_workloads_wheel,
    connect,
    open_ssh,
)
from tests.fixtures.sshd import free_port, sshd_env

REPO = Path(__file__).resolve().parents[1]

HOSTILE = ["$(touch {d}/pwned1)", "; touch {d}/pwned2", "`touch {d}/pwned3`", "a'b\"c", "*", "~"]


@pytest.fixture
def vm_env(sshd, monkeypatch, tmp_path):
    """The settings that make a cloud VM's address land on the loopback sshd."""
    for key, value in sshd_env(sshd).items():
        monkeypatch.setenv(key, value)
    return sshd


@pytest.fixture
def ex(sshd):
    target = SshTarget(sshd.host, sshd.port, sshd.user, sshd.client_key, [sshd.host_public])
    executor = open_ssh(target, timeout=20)
    yield executor
    executor.close()


def _vm(address: str = "203.0.113.7", user: str | None = "cloudprof") -> Instance:
    return Instance(provider="aws", id="i-0123", name="cp-test", machine="c6i.large",
                    address=address, user=user)


# ------------------------------------------------------------------ keys


def test_for_sweep_generates_private_keys_0600_and_reuses_them(tmp_path, monkeypatch):
    monkeypatch.delenv("CLOUDPROF_SSH_KEY", raising=False)
    monkeypatch.delenv("CLOUDPROF_SSH_HOST_KEY", raising=False)
    keys = SshKeys.for_sweep(tmp_path / "run1")
    assert keys.user_key.parent == tmp_path / "run1" / "keys"
    for private in (keys.user_key, keys.host_key):
        assert stat.S_IMODE(private.stat().st_mode) == 0o600
        # ssh-keygen agrees the file is a valid key, and derives the same public line
        derived = subprocess.run(["ssh-keygen", "-y", "-f", str(private)], check=True,
                                 capture_output=True, text=True).stdout.split()[:2]
        expected = keys.user_public if private == keys.user_key else keys.host_public
        assert derived == expected.split()[:2]
        assert derived[0] == "ssh-ed25519"
    assert keys.user_public.split()[1] != keys.host_public.split()[1]
    # a resume finds the same keys (the VMs already trust them)
    again = SshKeys.for_sweep(tmp_path / "run1")
    assert (again.user_public, again.host_public) == (keys.user_public, keys.host_public)
    # another sweep gets its own
    other = SshKeys.for_sweep(tmp_path / "run2")
    assert other.user_public.split()[1] != keys.user_public.split()[1]
    keys.remove()
    assert not (tmp_path / "run1" / "keys").exists()


def test_override_keys_are_used_and_never_removed(tmp_path, monkeypatch, sshd):
    monkeypatch.delenv("CLOUDPROF_SSH_KEY", raising=False)
    monkeypatch.setenv("CLOUDPROF_SSH_HOST_KEY", str(sshd.host_key))
    keys = SshKeys.for_sweep(tmp_path, override_key=sshd.client_key)
    assert keys.user_key == sshd.client_key
    assert keys.user_public.split()[:2] == sshd.client_public.split()[:2]
    assert keys.host_public.split()[:2] == sshd.host_public.split()[:2]
    assert keys.generated == []
    keys.remove()
    assert sshd.client_key.exists() and sshd.host_key.exists()
    monkeypatch.setenv("CLOUDPROF_SSH_KEY", str(sshd.client_key))
    assert SshKeys.for_sweep(tmp_path).user_key == sshd.client_key


def test_encrypted_or_bogus_override_key_is_one_line_usage_error(tmp_path):
    enc = tmp_path / "enc"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "secret", "-f", str(enc)],
                   check=True)
    with pytest.raises(UsageError, match="encrypted"):
        SshKeys.for_sweep(tmp_path / "run", override_key=enc)
    bogus = tmp_path / "bogus"
    bogus.write_text("not a key")
    with pytest.raises(UsageError, match="not a usable SSH private key"):
        SshKeys.for_sweep(tmp_path / "run", override_key=bogus)
    with pytest.raises(UsageError, match="cannot read SSH key"):
        SshKeys.for_sweep(tmp_path / "run", override_key=tmp_path / "missing")


# ------------------------------------------------------------------ startup script


def _header(script: str) -> str:
    """The variable assignments of the rendered script (everything before the marker)."""
    return script.split("# --- end of substituted values ---")[0]


def test_startup_script_is_valid_sh_and_carries_the_values(tmp_path, monkeypatch):
    monkeypatch.delenv("CLOUDPROF_SSH_KEY", raising=False)
    monkeypatch.delenv("CLOUDPROF_SSH_HOST_KEY", raising=False)
    keys = SshKeys.for_sweep(tmp_path)
    script = remote.startup_script(keys, "cloudprof", 1_900_000_000)
    path = tmp_path / "startup.sh"
    path.write_text(script)
    subprocess.run(["sh", "-n", str(path)], check=True)
    assert not re.search(r"@[A-Z_]+@", script)  # every placeholder filled
    # Evaluate just the assignments: the values come back byte for byte.
    probe = _header(script) + 'printf "%s\\n--\\n" "$SSH_USER" "$CLIENT_PUBLIC_KEY" ' \
        '"$HOST_PUBLIC_KEY" "$EXPIRES_AT"; printf "%s" "$HOST_PRIVATE_KEY"'
    out = subprocess.run(["sh", "-c", probe], check=True, capture_output=True, text=True).stdout
    parts = out.split("\n--\n")
    assert parts[:4] == ["cloudprof", keys.user_public, keys.host_public, "1900000000"]
    assert parts[4] == keys.host_key.read_text().strip()
    # The self-destruct and the delete-on-shutdown pieces are there.
    assert "systemd-run" in script and "shutdown -h" in script
    assert "cloudprof_host_ed25519_key" in script


def test_startup_script_quotes_hostile_values(tmp_path, monkeypatch):
    """A public key comment full of shell syntax stays data: nothing runs, value intact."""
    monkeypatch.delenv("CLOUDPROF_SSH_KEY", raising=False)
    monkeypatch.delenv("CLOUDPROF_SSH_HOST_KEY", raising=False)
    keys = SshKeys.for_sweep(tmp_path)
    marker = tmp_path / "pwned"
    evil_comment = f"x'$(touch {marker})\"`touch {marker}`; touch {marker} @SSH_USER@ \\"
    keys.user_public = keys.user_public.split(" ", 2)[0] + " " + \
        keys.user_public.split(" ", 2)[1] + " " + evil_comment
    script = remote.startup_script(keys, "cloudprof", 1_900_000_000)
    path = tmp_path / "startup.sh"
    path.write_text(script)
    subprocess.run(["sh", "-n", str(path)], check=True)
    out = subprocess.run(["sh", "-c", _header(script) + 'printf "%s" "$CLIENT_PUBLIC_KEY"'],
                         check=True, capture_output=True, text=True).stdout
    assert out == keys.user_public
    assert not marker.exists()


@pytest.mark.parametrize("user", ["root; rm -rf /", "a b", "$(id)", "", "Ünïcode"])
def test_startup_script_refuses_bad_user_names(tmp_path, monkeypatch, user):
    monkeypatch.delenv("CLOUDPROF_SSH_KEY", raising=False)
    monkeypatch.delenv("CLOUDPROF_SSH_HOST_KEY", raising=False)
    keys = SshKeys.for_sweep(tmp_path)
    with pytest.raises(UsageError, match="invalid SSH user"):
        remote.startup_script(keys, user, 1)


def test_startup_script_refuses_multiline_public_key(tmp_path, monkeypatch):
    monkeypatch.delenv("CLOUDPROF_SSH_KEY", raising=False)
    monkeypatch.delenv("CLOUDPROF_SSH_HOST_KEY", raising=False)
    keys = SshKeys.for_sweep(tmp_path)
    keys.user_public += "\nssh-ed25519 AAAAinjected attacker"
    with pytest.raises(UsageError, match="one-line OpenSSH public key"):
        remote.startup_script(keys, "cloudprof", 1)


# ------------------------------------------------------------------ connect


def test_connect_uses_endpoint_and_user_overrides(vm_env, tmp_path):
    keys = SshKeys.for_sweep(tmp_path)
    ex = connect(_vm(), keys, timeout=20)
    try:
        result = ex.run(["id", "-un"])
        assert result.exit_code == 0
        assert result.stdout_tail.strip() == vm_env.user
        assert ex.workdir == sshd_env(vm_env)["CLOUDPROF_SSH_WORKDIR"]
    finally:
        ex.close()


def test_parse_endpoint():
    assert remote.parse_endpoint("127.0.0.1:2222") == ("127.0.0.1", 2222)
    assert remote.parse_endpoint("example.org") == ("example.org", 22)
    assert remote.parse_endpoint("[::1]:2200") == ("::1", 2200)
    for bad in ("a:b", "host:0", "host:70000", "a b:22"):
        with pytest.raises(UsageError):
            remote.parse_endpoint(bad)


@pytest.mark.parametrize("from_env", [False, True])
def test_closed_port_is_unreachable_within_the_timeout(sshd, tmp_path, monkeypatch, from_env):
    """The wait for a VM's sshd ends at the timeout given, or at $CLOUDPROF_SSH_BOOT_TIMEOUT."""
    monkeypatch.setenv("CLOUDPROF_SSH_ENDPOINT", f"127.0.0.1:{free_port()}")
    monkeypatch.setenv("CLOUDPROF_SSH_KEY", str(sshd.client_key))
    monkeypatch.setenv("CLOUDPROF_SSH_HOST_KEY", str(sshd.host_key))
    if from_env:
        monkeypatch.setenv("CLOUDPROF_SSH_BOOT_TIMEOUT", "2")
    keys = SshKeys.for_sweep(tmp_path)
    start = time.monotonic()
    with pytest.raises(UnreachableError) as err:
        connect(_vm(), keys) if from_env else connect(_vm(), keys, timeout=2)
    elapsed = time.monotonic() - start
    assert 1.5 <= elapsed < 6
    message = str(err.value)
    assert "\n" not in message
    assert re.match(r"cannot reach cloudprof@127\.0\.0\.1:\d+ over SSH after 2s: connection "
                    r"refused$", message), message


_RESETTING_HOST = """
import socket, struct, sys, threading
from orchestrator.errors import UnreachableError
from orchestrator.providers import remote

server = socket.create_server(("127.0.0.1", 0))

def reset_each() -> None:  # an sshd going away: each connection reset before its banner
    while True:
        conn, _ = server.accept()
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()

threading.Thread(target=reset_each, daemon=True).start()
target = remote.SshTarget(host="127.0.0.1", port=server.getsockname()[1], user="u",
                          key_file=None, known_keys=[])
try:
    remote.open_ssh(target, timeout=1.5)
except UnreachableError as exc:
    print(exc)
"""


def test_a_connection_reset_mid_handshake_is_one_line_without_paramikos_traceback():
    """paramiko's transport thread logs a failed handshake with a traceback through
    logging's last resort (stderr): a user saw one when a VM's sshd went away. In a
    process of its own, as a user's sweep has no log handler (pytest's would catch it)."""
    proc = subprocess.run([sys.executable, "-c", _RESETTING_HOST], capture_output=True,
                          text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    said = proc.stdout
    assert re.match(r"cannot reach u@127\.0\.0\.1:\d+ over SSH after \S+: ", said), said
    assert said.count("\n") == 1
    assert "Traceback" not in proc.stderr and proc.stderr == "", proc.stderr


@pytest.mark.parametrize("raw", ["soon", "0", "-5", "inf"])
def test_a_bad_boot_timeout_is_one_line(monkeypatch, raw):
    monkeypatch.setenv("CLOUDPROF_SSH_BOOT_TIMEOUT", raw)
    with pytest.raises(UsageError, match=r"^CLOUDPROF_SSH_BOOT_TIMEOUT=.*seconds, e\.g\. 600$"):
        remote.boot_timeout()


def test_cancel_stops_waiting_for_a_booting_vm(sshd, tmp_path, monkeypatch):
    """Ctrl-C during 'waiting for SSH': the sweep's cancel event ends the wait at once."""
    monkeypatch.setenv("CLOUDPROF_SSH_ENDPOINT", f"127.0.0.1:{free_port()}")
    monkeypatch.setenv("CLOUDPROF_SSH_KEY", str(sshd.client_key))
    monkeypatch.setenv("CLOUDPROF_SSH_HOST_KEY", str(sshd.host_key))
    keys = SshKeys.for_sweep(tmp_path)
    threading.Timer(0.5, keys.cancel.set).start()
    start = time.monotonic()
    with pytest.raises(UnreachableError, match="sweep cancelled"):
        connect(_vm(), keys, timeout=300)
    assert time.monotonic() - start < 3


def test_host_key_mismatch_is_refused(sshd, tmp_path, monkeypatch):
    """A sweep expecting its own host key never logs in to a host presenting another."""
    monkeypatch.setenv("CLOUDPROF_SSH_ENDPOINT", f"{sshd.host}:{sshd.port}")
    monkeypatch.setenv("CLOUDPROF_SSH_USER", sshd.user)
    monkeypatch.setenv("CLOUDPROF_SSH_KEY", str(sshd.client_key))
    monkeypatch.delenv("CLOUDPROF_SSH_HOST_KEY", raising=False)
    keys = SshKeys.for_sweep(tmp_path)  # a freshly generated host key sshd does not have
    start = time.monotonic()
    with pytest.raises(HostKeyError) as err:
        connect(_vm(), keys, timeout=2)  # a booting VM: retried until the timeout
    assert time.monotonic() - start < 8
    assert "does not match" in str(err.value) and "\n" not in str(err.value)
    # A host that is not booting is refused at once.
    target = SshTarget(sshd.host, sshd.port, sshd.user, sshd.client_key, [keys.host_public])
    start = time.monotonic()
    with pytest.raises(HostKeyError, match="does not match"):
        open_ssh(target, timeout=30)
    assert time.monotonic() - start < 5


def test_unknown_host_is_refused_with_how_to_add_it(sshd, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # an empty ~/.ssh/known_hosts
    target = SshTarget(sshd.host, sshd.port, sshd.user, sshd.client_key, [])
    with pytest.raises(HostKeyError) as err:
        open_ssh(target, timeout=10)
    message = str(err.value)
    assert "is not known" in message and f"ssh-keyscan -p {sshd.port}" in message
    # ...and a known_hosts entry for it is honoured.
    ssh_dir = tmp_path / ".ssh"
    ssh_dir.mkdir()
    entry = " ".join(sshd.host_public.split()[:2])
    (ssh_dir / "known_hosts").write_text(f"[{sshd.host}]:{sshd.port} {entry}\n")
    ex = open_ssh(target, timeout=10)
    assert ex.run(["true"]).exit_code == 0
    ex.close()


def test_wrong_client_key_fails_authentication(sshd, tmp_path, monkeypatch):
    monkeypatch.delenv("CLOUDPROF_SSH_KEY", raising=False)
    monkeypatch.delenv("CLOUDPROF_SSH_HOST_KEY", raising=False)
    keys = SshKeys.for_sweep(tmp_path)  # not in authorized_keys
    target = SshTarget(sshd.host, sshd.port, sshd.user, keys.user_key, [sshd.host_public])
    with pytest.raises(UnreachableError, match="authentication failed"):
        open_ssh(target, timeout=10)


def test_a_vm_is_offered_only_the_sweeps_key(sshd, tmp_path, monkeypatch):
    """Neither ssh-agent nor ~/.ssh keys are offered: with an authorised key in both, a
    sweep key the host does not know still fails."""
    monkeypatch.delenv("CLOUDPROF_SSH_KEY", raising=False)
    monkeypatch.delenv("CLOUDPROF_SSH_HOST_KEY", raising=False)
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_bytes(sshd.client_key.read_bytes())
    (home / ".ssh" / "id_ed25519").chmod(0o600)
    monkeypatch.setenv("HOME", str(home))
    agent = subprocess.run(["ssh-agent", "-s"], capture_output=True, text=True, check=True)
    env = dict(re.findall(r"(SSH_AUTH_SOCK|SSH_AGENT_PID)=([^;]+);", agent.stdout))
    try:
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        subprocess.run(["ssh-add", "-q", str(sshd.client_key)], check=True, capture_output=True)
        keys = SshKeys.for_sweep(tmp_path / "run")
        target = SshTarget(sshd.host, sshd.port, sshd.user, keys.user_key, [sshd.host_public])
        with pytest.raises(UnreachableError, match="authentication failed"):
            open_ssh(target, timeout=5)
    finally:
        os.kill(int(env["SSH_AGENT_PID"]), 15)


# ------------------------------------------------------------------ run


def test_hostile_arguments_reach_the_command_verbatim(ex, tmp_path):
    args = [a.format(d=tmp_path) for a in HOSTILE]
    result = ex.run(["sh", "-c", 'printf "%s\\n" "$@"', "sh", *args])
    assert result.exit_code == 0
    assert result.stdout_tail.split("\n") == args
    result = ex.run(["echo", *args])
    assert result.stdout_tail == " ".join(args)
    assert not list(tmp_path.glob("pwned*"))


def test_lines_stream_as_they_arrive_and_exit_codes(ex):
    seen: list[tuple[float, str]] = []
    script = "echo first; sleep 1; echo second >&2; sleep 0.3; echo third; exit 7"
    start = time.monotonic()
    result = ex.run(["sh", "-c", script], on_line=lambda line: seen.append(
        (time.monotonic() - start, line)))
    end = time.monotonic() - start
    assert [line for _, line in seen] == ["first", "second", "third"]
    # "first" was delivered while the command was still sleeping, not at the end
    assert end - seen[0][0] >= 0.7
    assert result.exit_code == 7
    assert result.stdout_tail == "first\nthird"
    assert result.stderr_tail == "second"
    assert ex.run(["false"]).exit_code == 1
    assert ex.run(["sh", "-c", "kill -9 $$"]).exit_code in (137, -1)


def test_timeout_stops_the_remote_command(ex):
    tag = f"{time.time_ns() % 10**6}.5"  # a unique sleep argument to find it by
    start = time.monotonic()
    with pytest.raises(RemoteCommandError, match="timed out after 1s"):
        ex.run(["sleep", tag], timeout=1)
    assert time.monotonic() - start < 5
    time.sleep(0.3)
    procs = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout
    assert f"sleep {tag}" not in procs


def test_failing_line_handler_stops_the_remote_command(ex):
    tag = f"{time.time_ns() % 10**6}.25"

    def boom(line: str) -> None:
        raise RuntimeError("display broke")

    with pytest.raises(RuntimeError, match="display broke"):
        ex.run(["sh", "-c", f"echo hi; exec sleep {tag}"], on_line=boom)
    time.sleep(0.3)
    procs = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout
    assert f"sleep {tag}" not in procs
    assert ex.run(["true"]).exit_code == 0  # the connection is still usable


def test_put_and_get_roundtrip(ex, tmp_path):
    data = os.urandom(300_000)
    local = tmp_path / "blob.bin"
    local.write_bytes(data)
    remote_path = str(tmp_path / "remote" / "deep" / "dir" / "blob.bin")
    ex.put(local, remote_path)
    assert Path(remote_path).read_bytes() == data
    assert not list(Path(remote_path).parent.glob("*.part-*"))
    back = tmp_path / "back" / "blob.bin"
    ex.get(remote_path, back)
    assert back.read_bytes() == data
    with pytest.raises(FileNotFoundError):
        ex.get(str(tmp_path / "nope.json"), tmp_path / "nope.json")
    assert not (tmp_path / "nope.json").exists()
    assert not list((tmp_path).glob(".nope.json.*"))


def test_dropped_connection_is_connection_lost_and_reconnect_works(ex, sshd):
    errors: list[BaseException] = []
    started = threading.Event()

    def go():
        try:
            ex.run(["sh", "-c", "echo started; sleep 20"],
                   on_line=lambda line: started.set())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=go)
    thread.start()
    assert started.wait(10)
    assert sshd.kill_sessions() >= 1
    thread.join(15)
    assert not thread.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], ConnectionLostError), errors
    assert "lost" in str(errors[0])
    fresh = ex.reconnect(timeout=10)
    try:
        assert fresh.run(["true"]).exit_code == 0
    finally:
        fresh.close()


def test_sshd_killed_mid_command_then_back(private_sshd, tmp_path):
    """The host's sshd dies during a trial: ConnectionLostError, no login while it is
    down, and a reconnect once it is back."""
    server = private_sshd
    target = SshTarget(server.host, server.port, server.user, server.client_key,
                       [server.host_public])
    ex = open_ssh(target, timeout=10)
    errors: list[BaseException] = []
    started = threading.Event()

    def go():
        try:
            ex.run(["sh", "-c", "echo started; sleep 20"], on_line=lambda line: started.set())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=go)
    thread.start()
    assert started.wait(10)
    server.stop()
    thread.join(15)
    assert len(errors) == 1 and isinstance(errors[0], ConnectionLostError), errors
    with pytest.raises(UnreachableError, match="connection refused"):
        ex.reconnect(timeout=1)
    server.start()
    fresh = ex.reconnect(timeout=10)
    try:
        assert fresh.run(["echo", "back"]).stdout_tail == "back"
    finally:
        fresh.close()


def test_host_facts_are_read_from_the_host(ex):
    facts = ex.host_facts()
    nproc = int(subprocess.run(["nproc"], capture_output=True, text=True).stdout)
    assert facts["vcpus"] == nproc
    meminfo = Path("/proc/meminfo").read_text().split("\n")[0].split()
    assert facts["memory_gib"] == pytest.approx(int(meminfo[1]) / 2**20, abs=0.01)


# ------------------------------------------------------------------ the wheel and bootstrap


def test_workloads_wheel_is_a_valid_wheel_of_only_workloads(tmp_path):
    import base64
    import hashlib

    wheel, digest = build_workloads_wheel(tmp_path)
    (tmp_path / "again").mkdir()
    again, digest2 = build_workloads_wheel(tmp_path / "again")
    assert digest == digest2 and wheel.read_bytes() == again.read_bytes()  # deterministic
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        top = {n.split("/")[0] for n in names}
        dist_info = [t for t in top if t.endswith(".dist-info")]
        assert top == {"workloads", *dist_info} and len(dist_info) == 1
        assert "workloads/protocol.py" in names
        assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
        meta = zf.read(f"{dist_info[0]}/METADATA").decode()
        requires = [line.split(":", 1)[1].strip() for line in meta.splitlines()
                    if line.startswith("Requires-Dist:")]
        assert [re.split(r"[<>=! ]", r)[0] for r in requires] == ["numpy", "pyarrow", "psutil"]
        assert "Tag: py3-none-any" in zf.read(f"{dist_info[0]}/WHEEL").decode()
        record = zf.read(f"{dist_info[0]}/RECORD").decode().splitlines()
        assert len(record) == len(names)
        for line in record:
            name, hash_, size = line.rsplit(",", 2)
            if name.endswith("RECORD"):
                continue
            data = zf.read(name)
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            assert hash_ == f"sha256={expected.decode()}" and int(size) == len(data)
    # Any change to the shipped code gives another hash (and so another venv on the host).
    import shutil

    import workloads

    copy = tmp_path / "src" / "workloads"
    shutil.copytree(Path(workloads.__file__).parent, copy,
                    ignore=shutil.ignore_patterns("__pycache__"))
    assert build_workloads_wheel(tmp_path, source=copy)[1] == digest
    (copy / "protocol.py").write_text((copy / "protocol.py").read_text() + "\n# changed\n")
    (tmp_path / "changed").mkdir()
    assert build_workloads_wheel(tmp_path / "changed", source=copy)[1] != digest


@pytest.mark.slow
def test_bootstrap_installs_once_then_reuses(vm_env, tmp_path, monkeypatch):
    """Two sweeps on one host: the second finds the env for this wheel and skips the install."""
    workdir = tmp_path / "host-workdir"
    monkeypatch.setenv("CLOUDPROF_SSH_WORKDIR", str(workdir))
    keys = SshKeys.for_sweep(tmp_path / "run")
    # envs of older wheels: one unused for longer than the retention, one used lately,
    # and a half-built one two days old (its install died)
    day = 86400
    for name, age in (("env-stale", ENV_RETENTION_DAYS + 1), ("env-recent", 1),
                      ("env-dead.tmp-42", 2)):  # fmt: skip
        (workdir / name).mkdir(parents=True)
        stamp = workdir / name / (".last-used" if ".tmp-" not in name else "")
        stamp.touch()
        os.utime(stamp, (time.time() - age * day,) * 2)
    timings = {}
    for sweep in ("first", "second"):
        ex = connect(_vm(), keys, timeout=20)
        try:
            start = time.monotonic()
            ex.ensure_workloads()
            timings[sweep] = time.monotonic() - start
            assert ex.last_bootstrap == ("installed" if sweep == "first" else "reused")
            out = ex.run([ex.python, "-c", "import workloads, numpy; print(workloads.__file__)"])
            assert out.exit_code == 0, out.stderr_tail
            # the package imported is the wheel's copy in the hash-keyed env, not the checkout
            assert out.stdout_tail.startswith(str(workdir / "env-"))
            assert ex.python.startswith(str(workdir / "env-"))
        finally:
            ex.close()
    log = (workdir / "bootstrap.log").read_text().split("\n")
    actions = [line.split()[1:] for line in log if line]
    digest = Path(ex.python).parent.parent.name.removeprefix("env-")
    assert actions == [["install", digest, "index"], ["reuse", digest]]  # no wheels given
    envs = sorted(p.name for p in workdir.iterdir() if p.name.startswith("env-"))
    assert envs == sorted([f"env-{digest}", "env-recent"])  # the stale and dead ones pruned
    assert (workdir / f"env-{digest}" / ".last-used").exists()
    print(f"bootstrap: first {timings['first']:.2f}s, second {timings['second']:.2f}s")


@pytest.mark.slow
def test_two_sweeps_bootstrapping_one_host_at_once(vm_env, tmp_path, monkeypatch):
    """Both get a working env; the loser of the race drops its copy; nothing half-built stays."""
    workdir = tmp_path / "shared-workdir"
    monkeypatch.setenv("CLOUDPROF_SSH_WORKDIR", str(workdir))
    keys = SshKeys.for_sweep(tmp_path / "run")
    executors = [connect(_vm(), keys, timeout=20) for _ in range(2)]
    errors: list[BaseException] = []

    def boot(ex):
        try:
            ex.ensure_workloads()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=boot, args=(ex,)) for ex in executors]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    try:
        assert not errors, errors
        assert executors[0].python == executors[1].python
        for ex in executors:
            result = ex.run([ex.python, "-c", "import workloads.protocol"])
            assert result.exit_code == 0, result.stderr_tail
    finally:
        for ex in executors:
            ex.close()
    leftovers = [p.name for p in workdir.iterdir() if ".tmp-" in p.name]
    assert leftovers == []
    assert len([p for p in workdir.iterdir() if p.name.startswith("env-")]) == 1


def test_bootstrap_failure_is_one_line_remote_command_error(vm_env, tmp_path, monkeypatch):
    monkeypatch.setenv("CLOUDPROF_SSH_WORKDIR", str(tmp_path / "wd"))
    monkeypatch.setenv("CLOUDPROF_SSH_PYTHON", str(tmp_path / "no-such-python"))
    ex = connect(_vm(), SshKeys.for_sweep(tmp_path / "run"), timeout=20)
    try:
        with pytest.raises(RemoteCommandError) as err:
            ex.ensure_workloads()
    finally:
        ex.close()
    assert "installing the workloads wheel" in str(err.value)
    assert "no-such-python" in str(err.value) and "\n" not in str(err.value)


def test_commands_are_quoted_not_interpolated_by_the_login_shell(ex, tmp_path):
    """The exact string sent is shlex-quoted; even a command name with spaces stays one word."""
    odd = tmp_path / "dir with space;$(x)"
    odd.mkdir()
    script = odd / "tool"
    script.write_text("#!/bin/sh\necho ran \"$1\"\n")
    script.chmod(0o755)
    result = ex.run([str(script), "a b"])
    assert result.exit_code == 0 and result.stdout_tail == "ran a b"
    assert shlex.split(shlex.join([str(script)])) == [str(script)]


# ------------------------------------------------------------------ the startup script, for real

# Runs infra/startup.sh as root in a private mount namespace: /etc (a copy),
# /home and /var/lib are tmpfs there, and systemd-run/systemctl/shutdown are
# stubs (in a tmpfs /usr/local/sbin) that log their arguments, so the host is
# untouched. Then the image's own sshd config (as the script left it) is
# started in that namespace, and cloudprof must log in as the new user,
# verifying the sweep's host key.
_SANDBOX = r"""
set -e
stubs=$1; script=$2; port=$3
copy=$(mktemp -d)
cp -a /etc/. "$copy/"
mount -t tmpfs tmpfs /etc
cp -a "$copy/." /etc/
rm -rf "$copy"
mount -t tmpfs tmpfs /home
mount -t tmpfs tmpfs /var/lib  # empty: the script only adds /var/lib/cloudprof
# /usr/local/sbin comes first in the script's PATH: the stubs there shadow the real tools
mount -t tmpfs tmpfs /usr/local/sbin
for tool in systemd-run systemctl shutdown; do
    cp "$stubs/stub" "/usr/local/sbin/$tool"
done
sh "$script" >"$stubs/startup.out" 2>&1
[ "$port" = none ] && exit 0
mkdir -p /run/sshd
exec /usr/sbin/sshd -D -e -p "$port" -o ListenAddress=127.0.0.1 -o PidFile=none
"""


def _write_stub(stubs: Path, failing: str = "") -> None:
    """One stub for every tool: logs its name and arguments; ``failing`` tools exit 1."""
    (stubs / "stub").write_text(
        f'#!/bin/sh\necho "$(basename "$0") $*" >> {stubs}/calls\n'
        f'case "$(basename "$0")" in {failing or "-"}) exit 1;; esac\n'
    )
    (stubs / "stub").chmod(0o755)


def _can_sandbox() -> bool:
    return os.geteuid() == 0 and subprocess.run(
        ["unshare", "--mount", "--fork", "true"], capture_output=True).returncode == 0


@pytest.mark.slow
def test_startup_script_really_installs_host_key_user_and_expiry(tmp_path, monkeypatch):
    if not _can_sandbox():
        pytest.fail("this test needs root and unshare --mount (CI runs as root)")
    monkeypatch.delenv("CLOUDPROF_SSH_KEY", raising=False)
    monkeypatch.delenv("CLOUDPROF_SSH_HOST_KEY", raising=False)
    keys = SshKeys.for_sweep(tmp_path / "run")
    marker = tmp_path / "pwned"
    parts = keys.user_public.split(" ", 2)
    keys.user_public = f"{parts[0]} {parts[1]} cloudprof $(touch {marker})'`id`"
    rendered_at = time.time()
    expires = int(rendered_at) + 3600
    script = tmp_path / "startup.sh"
    script.write_text(remote.startup_script(keys, "cpboot", expires))
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    _write_stub(stubs)
    port = free_port()
    proc = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "--fork",
         "sh", "-c", _SANDBOX, "sh", str(stubs), str(script), str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        target = SshTarget("127.0.0.1", port, "cpboot", keys.user_key, [keys.host_public],
                           booting=True)  # refused until the script is done and sshd is up
        ex = open_ssh(target, timeout=30)
        try:
            assert ex.run(["id", "-un"]).stdout_tail == "cpboot"
            listing = ex.run(["ls", "-ln", "/etc/ssh/cloudprof_host_ed25519_key"]).stdout_tail
            assert listing.startswith("-rw-------")
            done = ex.run(["test", "-e", "/var/lib/cloudprof/startup.done"])
            assert done.exit_code == 0
        finally:
            ex.close()
    finally:
        os.killpg(proc.pid, 15)
        output = proc.communicate(timeout=10)[0].decode(errors="replace")
    calls = (stubs / "calls").read_text().splitlines()
    (expiry,) = [c for c in calls if c.startswith("systemd-run")]
    secs = int(re.search(r"--on-active=(\d+)s", expiry).group(1))
    assert expires - time.time() - 1 <= secs <= expires - rendered_at + 1
    assert expiry.endswith(" poweroff")
    assert "systemctl restart ssh" in calls
    assert not marker.exists(), output
    assert "cloudprof-startup: done" in (stubs / "startup.out").read_text()
    # the host itself is untouched
    assert not Path("/etc/ssh/cloudprof_host_ed25519_key").exists()
    assert subprocess.run(["id", "cpboot"], capture_output=True).returncode != 0


@pytest.mark.slow
def test_startup_script_falls_back_to_shutdown_when_systemd_run_fails(tmp_path, monkeypatch):
    if not _can_sandbox():
        pytest.fail("this test needs root and unshare --mount (CI runs as root)")
    monkeypatch.delenv("CLOUDPROF_SSH_KEY", raising=False)
    monkeypatch.delenv("CLOUDPROF_SSH_HOST_KEY", raising=False)
    keys = SshKeys.for_sweep(tmp_path / "run")
    script = tmp_path / "startup.sh"
    script.write_text(remote.startup_script(keys, "cpboot", int(time.time()) + 600))
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    _write_stub(stubs, failing="systemd-run")
    subprocess.run(["unshare", "--mount", "--propagation", "private", "--fork", "sh", "-c",
                    _SANDBOX, "sh", str(stubs), str(script), "none"], check=True, timeout=60)
    calls = (stubs / "calls").read_text().splitlines()
    shutdowns = [c for c in calls if c.startswith("shutdown")]
    assert len(shutdowns) == 1 and shutdowns[0].startswith("shutdown -h +10 ")
    assert "power-off scheduled in 10 min (shutdown -h)" in (stubs / "startup.out").read_text()


@pytest.mark.slow
def test_profile_bootstrap_installs_py_spy_into_the_trial_env_once(ex, tmp_path):
    """--profile cpu: py-spy is pip-installed into the env the trials use, and only once."""
    import subprocess
    import sys

    env = tmp_path / "env-test"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(env)],
                   check=True, capture_output=True, timeout=300)  # fmt: skip
    ex.python = str(env / "bin" / "python")
    assert not (env / "bin" / "py-spy").exists()
    assert ex.ensure_profiler("cpu") is None
    assert os.access(env / "bin" / "py-spy", os.X_OK)
    assert ex.ensure_profiler("cpu") is None  # already there: nothing installed again
    log = (tmp_path / "bootstrap.log").read_text().splitlines()
    assert len(log) == 1 and log[0].endswith("profiler py-spy>=0.4")
