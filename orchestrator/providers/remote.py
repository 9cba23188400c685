"""Remote execution over SSH: connecting, the bootstrap, and an Executor.

The sweep's keys and the VM's first-boot script are in ``ssh_keys``, the
bootstrap's shell scripts in ``bootstrap`` (``infra/bootstrap/``), the wheel
that ships in ``wheels``; their names are re-exported here.

Why it looks like this:

- **Keys per sweep.** A sweep generates its own ed25519 client key (never the
  user's own key) *and* the VM's host key. The host key goes to the VM in the
  startup script, so cloudprof knows the key to expect before the VM exists and
  verifies it on every connection — no trust-on-first-use, no AutoAddPolicy.
  Both live in ``<run>/keys/`` (0600) and are deleted at teardown.
- **Nothing reaches a shell unquoted.** Commands are argv lists joined with
  ``shlex.quote``; values substituted into ``infra/startup.sh`` are quoted too.
- **Bootstrap is cached on the host.** The ``workloads`` package ships as a
  wheel named by its content hash and is installed into a venv keyed by that
  hash, so a second sweep on the same host reuses it and starts in seconds. Its
  dependencies come from the sweep's staged wheels (``wheelhouse``), else the index.
- **Errors are one line** and typed (UnreachableError, HostKeyError,
  RemoteCommandError, ConnectionLostError) so the engine can decide: next
  machine, or reconnect and retry the trial.

Settings (environment), documented in docs/tutorials/ssh-hosts.md:
``CLOUDPROF_SSH_ENDPOINT=host:port`` replaces the address a cloud provider
returns; ``CLOUDPROF_SSH_USER`` the login user; ``CLOUDPROF_SSH_KEY`` a client
private key to use instead of a generated one; ``CLOUDPROF_SSH_HOST_KEY`` a host
private key to use instead of a generated one (for an sshd already running with
it, as in the tests); ``CLOUDPROF_SSH_WORKDIR`` the directory on the host that
holds cloudprof's files (default ``~/.cloudprof``); ``CLOUDPROF_SSH_PYTHON`` the
host's interpreter the bootstrap venv is built from (default ``python3``);
``CLOUDPROF_SSH_BOOT_TIMEOUT`` how long to wait for a new VM's sshd (seconds,
default 300).

paramiko and cryptography are imported inside functions: the CLI must start
without them.
"""

from __future__ import annotations

import base64
import contextlib
import io
import logging
import os
import posixpath
import random
import re
import shlex
import socket
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.atomic import atomic_path
from orchestrator.errors import (
    ConnectionLostError,
    HostKeyError,
    RemoteCommandError,
    UnreachableError,
    UsageError,
)
from orchestrator.providers.base import CommandResult, Executor, Instance
from orchestrator.providers.bootstrap import _INSTALL_SCRIPT as _INSTALL_SCRIPT
from orchestrator.providers.bootstrap import _PACKAGE_SCRIPT as _PACKAGE_SCRIPT
from orchestrator.providers.bootstrap import _RAY_PROBE as _RAY_PROBE
from orchestrator.providers.bootstrap import _REUSE_SCRIPT as _REUSE_SCRIPT
from orchestrator.providers.bootstrap import ENV_RETENTION_DAYS as ENV_RETENTION_DAYS
from orchestrator.providers.bootstrap import PROFILER_PACKAGES as PROFILER_PACKAGES
from orchestrator.providers.bootstrap import RAY_REQUIREMENT as RAY_REQUIREMENT
from orchestrator.providers.ssh_keys import ENV_HOST_KEY as ENV_HOST_KEY
from orchestrator.providers.ssh_keys import ENV_KEY as ENV_KEY
from orchestrator.providers.ssh_keys import PUBLIC_KEY_RE as PUBLIC_KEY_RE
from orchestrator.providers.ssh_keys import SOURCE_CIDR_ENV as SOURCE_CIDR_ENV
from orchestrator.providers.ssh_keys import STARTUP_STATE_DIR as STARTUP_STATE_DIR
from orchestrator.providers.ssh_keys import SshKeys as SshKeys
from orchestrator.providers.ssh_keys import caller_cidr as caller_cidr
from orchestrator.providers.ssh_keys import public_line as public_line
from orchestrator.providers.ssh_keys import startup_script as startup_script
from orchestrator.providers.wheels import build_workloads_wheel as build_workloads_wheel
from orchestrator.providers.wheels import workloads_wheel as workloads_wheel

if TYPE_CHECKING:
    import paramiko

    from orchestrator.providers.wheelhouse import WheelSource

log = logging.getLogger("cloudprof.remote")
# paramiko's transport thread logs a failed handshake (a VM's sshd going away mid-banner)
# with its traceback, which logging's last resort printed on the user's terminal; the
# same error reaches the caller as an exception, which the sweep reports in one line.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

ENV_ENDPOINT = "CLOUDPROF_SSH_ENDPOINT"
ENV_USER = "CLOUDPROF_SSH_USER"
ENV_WORKDIR = "CLOUDPROF_SSH_WORKDIR"
ENV_PYTHON = "CLOUDPROF_SSH_PYTHON"
ENV_BOOT_TIMEOUT = "CLOUDPROF_SSH_BOOT_TIMEOUT"
BOOT_TIMEOUT_S = 300.0  # a cloud VM's sshd is usually up in 30-90 s
TAIL_LINES = 20
REFUSED_GRACE_S = 3.0  # how long a host that is not booting may refuse connections


# --------------------------------------------------------------------------- connecting


@dataclass
class SshTarget:
    """Where and how to log in, and which host keys to accept."""

    host: str
    port: int
    user: str
    key_file: Path | None  # None: ssh-agent / ~/.ssh default keys (user hosts only)
    known_keys: list[str]  # accepted host public lines; empty: ~/.ssh/known_hosts
    booting: bool = False  # a VM still booting: retry host-key/auth failures until timeout
    python: str | None = None  # interpreter the venv is built from (else $CLOUDPROF_SSH_PYTHON)

    @property
    def label(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"


class _Transient(Exception):
    """A connection attempt failed in a way that may succeed later (the VM boots)."""

    def __init__(self, reason: str, final: Exception | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.final = final  # raised instead of UnreachableError if it is the last failure


def parse_endpoint(text: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` or ``host`` (port 22)."""
    text = text.strip()
    m = re.match(r"^\[([0-9A-Fa-f:.]+)\](?::(\d+))?$", text) or re.match(
        r"^([A-Za-z0-9._-]+)(?::(\d+))?$", text
    )
    if not m:
        raise UsageError(f"invalid SSH endpoint {text!r}: use host:port")
    port = int(m.group(2) or 22)
    if not 0 < port < 65536:
        raise UsageError(f"invalid SSH port in {text!r}")
    return m.group(1), port


def host_key_from_line(line: str) -> paramiko.PKey:
    """A paramiko key from an OpenSSH public line; UsageError when it does not parse."""
    import paramiko

    parts = line.split()
    if len(parts) < 2:
        raise UsageError(f"invalid host public key {line[:40]!r}")
    try:
        return paramiko.PKey.from_type_string(parts[0], base64.b64decode(parts[1]))
    except Exception as exc:  # paramiko raises several types for bad key data
        raise UsageError(f"invalid host public key {line[:40]!r}: {exc}") from None


def _load_client_key(path: Path) -> paramiko.PKey:
    import paramiko

    try:
        return paramiko.PKey.from_path(Path(path).expanduser())
    except paramiko.PasswordRequiredException:
        raise UsageError(f"SSH key {path} is encrypted: use an unencrypted key") from None
    except (OSError, paramiko.SSHException, ValueError) as exc:
        raise UsageError(f"cannot load SSH key {path}: {exc}") from None


class _LocalWriteError(Exception):
    """A local write failed during a download; not an OSError, so ``_errors`` (which takes
    OSErrors for the connection's) lets it through to be raised as the OSError it holds."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


class _LocalWrites:
    """A file object for ``sftp.getfo`` whose write errors say they are local."""

    def __init__(self, fh: Any) -> None:
        self.fh = fh

    def write(self, data: bytes) -> int:
        try:
            return self.fh.write(data)
        except OSError as exc:
            raise _LocalWriteError(exc) from exc


def _connect_once(target: SshTarget, attempt_timeout: float) -> paramiko.SSHClient:
    import paramiko

    host_keys_name = target.host if target.port == 22 else f"[{target.host}]:{target.port}"

    class RejectUnknown(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
            raise HostKeyError(
                f"host key of {target.label} ({key.get_name()} {key.fingerprint}) is not known: "
                f"check it, then add it with `ssh-keyscan -p {target.port} {target.host} "
                ">> ~/.ssh/known_hosts` or set known_host_key in the hosts file"
            )

    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(RejectUnknown())
    if target.known_keys:
        store = client.get_host_keys()
        for line in target.known_keys:
            key = host_key_from_line(line)
            store.add(host_keys_name, key.get_name(), key)
    else:
        with contextlib.suppress(OSError):
            client.load_system_host_keys()
    pkey = _load_client_key(target.key_file) if target.key_file else None
    try:
        sock = socket.create_connection((target.host, target.port), timeout=attempt_timeout)
    except socket.gaierror as exc:
        raise UnreachableError(
            f"cannot reach {target.label} over SSH: cannot resolve {target.host}: {exc.strerror}"
        ) from None
    except ConnectionRefusedError:
        raise _Transient("connection refused") from None
    except TimeoutError:
        raise _Transient("timed out") from None
    except OSError as exc:
        raise _Transient(exc.strerror or str(exc)) from None
    try:
        client.connect(
            target.host,
            port=target.port,
            username=target.user,
            pkey=pkey,
            sock=sock,
            timeout=attempt_timeout,
            banner_timeout=attempt_timeout,
            auth_timeout=attempt_timeout,
            allow_agent=pkey is None,
            look_for_keys=pkey is None,
        )
    except HostKeyError:
        client.close()
        raise
    except paramiko.BadHostKeyException as exc:
        client.close()
        error = HostKeyError(
            f"host key of {target.label} does not match: it presented "
            f"{exc.key.get_name()} {exc.key.fingerprint}, expected {exc.expected_key.fingerprint} "
            "— refusing to connect"
        )
        if target.booting:  # the image's own key until the startup script installs ours
            raise _Transient("host key does not match (yet)", error) from None
        raise error from None
    except paramiko.AuthenticationException:
        client.close()
        key = target.key_file or "ssh-agent/default keys"
        error = UnreachableError(f"SSH authentication failed for {target.label} with key {key}")
        if target.booting:  # the key is authorised by the startup script
            raise _Transient("authentication failed (yet)", error) from None
        raise error from None
    except (paramiko.SSHException, EOFError, OSError) as exc:
        client.close()
        raise _Transient(" ".join(str(exc).split()) or type(exc).__name__) from None
    return client


def open_ssh(
    target: SshTarget, timeout: float = 300, cancel: threading.Event | None = None
) -> SshExecutor:
    """Log in to ``target``, retrying with exponential backoff and jitter until ``timeout``.

    ``cancel`` (the sweep's stop event) ends the wait at once, so Ctrl-C never
    waits for a VM that is still booting.
    """
    start = time.monotonic()
    deadline = start + timeout
    attempt = 0
    while True:
        remaining = deadline - time.monotonic()
        try:
            client = _connect_once(target, max(1.0, min(15.0, remaining)))
        except _Transient as exc:
            last = exc
        else:
            try:
                return SshExecutor(client, target)
            except ConnectionLostError as exc:  # dropped right after login (sshd restarting)
                client.close()
                last = _Transient(str(exc))
            except BaseException:
                client.close()
                raise
        remaining = deadline - time.monotonic()
        if not target.booting and last.reason == "connection refused":
            # A host that is up but refuses SSH is misconfigured, not booting.
            remaining = min(remaining, start + REFUSED_GRACE_S - time.monotonic())
        if remaining <= 0:
            if last.final is not None:
                raise last.final
            waited = time.monotonic() - start
            raise UnreachableError(
                f"cannot reach {target.label} over SSH after {waited:.0f}s: {last.reason}"
            )
        delay = min(10.0, 0.25 * 2**attempt) * random.uniform(0.5, 1.0)
        log.debug("ssh %s: %s; retrying in %.1fs", target.label, last.reason, delay)
        if cancel is not None and cancel.wait(min(delay, remaining)):
            raise UnreachableError(f"stopped waiting for SSH on {target.label}: sweep cancelled")
        if cancel is None:
            time.sleep(min(delay, remaining))
        attempt += 1


def endpoint_of(inst: Instance) -> tuple[str, int, str | None]:
    """The (host, port, user) to reach ``inst``, after CLOUDPROF_SSH_ENDPOINT/_USER."""
    host, port = inst.address, inst.port
    override = os.environ.get(ENV_ENDPOINT)
    if override:
        host, port = parse_endpoint(override)
    user = os.environ.get(ENV_USER) or inst.user
    if not host:
        raise UnreachableError(f"instance {inst.name} has no address to reach over SSH")
    return host, port, user


def connect(inst: Instance, keys: SshKeys | None, timeout: float | None = None) -> SshExecutor:
    """An executor on a VM cloudprof created: the sweep's client key, the sweep's host key.

    While the VM boots its sshd may still present the image's own host key or
    not yet accept the sweep's client key; both are retried until ``timeout``
    (default ``$CLOUDPROF_SSH_BOOT_TIMEOUT``, else 300 s), then reported
    (HostKeyError for a key that never matched).
    """
    if timeout is None:
        timeout = boot_timeout()
    if keys is None:  # a provider used outside a sweep (cleanup) has no keys to log in with
        raise UsageError(f"no SSH keys to reach {inst.name}: connect only within a sweep")
    host, port, user = endpoint_of(inst)
    if not user:
        raise UsageError(f"no SSH user for instance {inst.name}: set {ENV_USER}")
    target = SshTarget(
        host=host,
        port=port,
        user=user,
        key_file=Path(keys.user_key),
        known_keys=[keys.host_public],
        booting=True,
    )
    return open_ssh(target, timeout, keys.cancel)


def boot_timeout() -> float:
    """Seconds to wait for a new VM's sshd: ``$CLOUDPROF_SSH_BOOT_TIMEOUT`` or 300."""
    raw = os.environ.get(ENV_BOOT_TIMEOUT, "").strip()
    if not raw:
        return BOOT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise UsageError(f"{ENV_BOOT_TIMEOUT}={raw!r}: give a number of seconds, e.g. 600")
    return value


# --------------------------------------------------------------------------- the executor


class _Lines:
    """Splits a byte stream into lines, passes each on, and keeps the last few."""

    def __init__(self, on_line: Callable[[str], None] | None) -> None:
        self.buf = b""
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.on_line = on_line

    def feed(self, data: bytes) -> None:
        self.buf += data
        *lines, self.buf = self.buf.split(b"\n")
        for raw in lines:
            self._emit(raw)

    def flush(self) -> None:
        if self.buf:
            self._emit(self.buf)
            self.buf = b""

    def _emit(self, raw: bytes) -> None:
        line = raw.decode("utf-8", "replace").rstrip("\r")
        self.tail.append(line)
        if self.on_line is not None:
            self.on_line(line)


_PID_MARK = "cloudprof-pid"
_RUN_WRAPPER = f'echo {_PID_MARK} $$ >&2; "$@"; exit $?'


class _PidMarker:
    """Splits the remote shell's first stderr line, ``cloudprof-pid N``, off the stream."""

    def __init__(self) -> None:
        self.pid: int | None = None  # -1 when the first line was something else
        self._buf = b""

    def feed(self, data: bytes) -> bytes:
        """The part of ``data`` that is the command's own stderr."""
        if self.pid is not None:
            return data
        self._buf += data
        head, sep, rest = self._buf.partition(b"\n")
        if not sep:
            return b""
        words = head.decode(errors="replace").split()
        if len(words) == 2 and words[0] == _PID_MARK and words[1].isdigit():
            self.pid = int(words[1])
            return rest
        self.pid = -1
        return self._buf


class SshExecutor(Executor):
    """Runs commands and moves files on one host over one SSH connection."""

    def __init__(self, client: paramiko.SSHClient, target: SshTarget) -> None:
        self.client = client
        self.target = target
        self._sftp: Any = None
        self._lock = threading.Lock()
        self._running: set[int] = set()  # remote pids of commands in flight
        self.home = self._sftp_client().normalize(".")
        self.workdir = os.environ.get(ENV_WORKDIR) or f"{self.home}/.cloudprof"
        # The host's interpreter the bootstrap venv is made from; ``python`` becomes
        # the venv's own interpreter once ``ensure_workloads`` ran.
        self.base_python = target.python or os.environ.get(ENV_PYTHON) or "python3"
        self.python = self.base_python
        self.last_bootstrap: str | None = None  # "installed" | "reused"
        self.bootstrap_source: str | None = None  # "staged" | "index", once installed

    # -- plumbing

    def _transport(self) -> Any:
        transport = self.client.get_transport()
        if transport is None or not transport.is_active():
            raise ConnectionLostError(f"SSH connection to {self.target.label} was lost")
        return transport

    def _sftp_client(self) -> Any:
        with self._lock:
            if self._sftp is None:
                with self._errors("opening SFTP"):
                    self._sftp = self.client.open_sftp()
            return self._sftp

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """paramiko/socket errors → ConnectionLostError (connection gone) or RemoteCommandError."""
        import paramiko

        try:
            yield
        except (paramiko.SSHException, EOFError, OSError) as exc:
            if isinstance(exc, FileNotFoundError):
                raise
            transport = self.client.get_transport()
            reason = " ".join(str(exc).split()) or type(exc).__name__
            if transport is None or not transport.is_active() or isinstance(exc, EOFError):
                raise ConnectionLostError(
                    f"SSH connection to {self.target.label} lost while {what}: {reason}"
                ) from None
            raise RemoteCommandError(f"{what} on {self.target.label} failed: {reason}") from None

    def _abs(self, remote: str) -> str:
        if remote == "~" or remote.startswith("~/"):
            return self.home + remote[1:]
        return remote

    # -- Executor

    def run(
        self,
        argv: Sequence[str],
        *,
        on_line: Callable[[str], None] | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        """Run ``argv`` on the host (each word shell-quoted), streaming stdout and stderr lines.

        The remote shell first reports the command's pid so a timeout, Ctrl-C or
        ``close`` can stop it instead of leaving it running on the host.
        """
        if not argv:
            raise ValueError("empty command")
        # The user's login shell only sees `sh -c '<constant>' sh 'arg'...`: argv
        # reaches the command as positional parameters, never re-parsed. sh
        # reports its pid, then runs "$@" without `exec`, so it waits and
        # reports 128+N when the command dies of signal N (sshd sends no exit
        # status for a killed process); sh leads the session's process group, so
        # killing "-pid" stops the command and its children too.
        command = shlex.join(["sh", "-c", _RUN_WRAPPER, "sh", *(str(a) for a in argv)])
        out, err = _Lines(on_line), _Lines(on_line)
        marker = _PidMarker()
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._errors(f"running {argv[0]}"):
            chan = self._transport().open_session()
            chan.exec_command(command)
        try:
            while True:
                busy = False
                with self._errors(f"running {argv[0]}"):
                    if chan.recv_stderr_ready():  # first: it carries the pid marker
                        busy = True
                        err.feed(marker.feed(chan.recv_stderr(65536)))
                        if marker.pid is not None and marker.pid > 0:
                            self._running.add(marker.pid)
                    if chan.recv_ready():
                        busy = True
                        out.feed(chan.recv(65536))
                    # status_event is also set when the channel closes without a status,
                    # which is what a dropped connection looks like: told apart below.
                    if (
                        (chan.status_event.is_set() or chan.closed)
                        and not chan.recv_ready()
                        and not chan.recv_stderr_ready()
                    ):
                        break
                if deadline is not None and time.monotonic() > deadline:
                    raise RemoteCommandError(  # the process is stopped below
                        f"{argv[0]} on {self.target.label} timed out after {timeout:g}s"
                    )
                if not busy:
                    time.sleep(0.01)
            if chan.exit_status != -1:  # paramiko's value until an exit-status arrives
                code = chan.exit_status
            else:
                time.sleep(0.2)  # a dying transport closes its channels before it stops
                if not self.is_connected():
                    raise ConnectionLostError(
                        f"SSH connection to {self.target.label} lost while running {argv[0]}"
                    )
                code = -1  # the remote shell itself was killed: sshd sent no status
        except BaseException:  # timeout, Ctrl-C, a failing on_line: never leave it running
            with contextlib.suppress(Exception):
                give_up = time.monotonic() + 1.0
                while marker.pid is None and time.monotonic() < give_up:
                    if chan.recv_stderr_ready():
                        marker.feed(chan.recv_stderr(65536))
                    else:
                        time.sleep(0.01)
            self._kill(marker.pid)
            raise
        finally:
            if marker.pid is not None:
                self._running.discard(marker.pid)
            with contextlib.suppress(Exception):
                chan.close()
        out.flush()
        err.flush()
        return CommandResult(code, "\n".join(out.tail), "\n".join(err.tail))

    def is_connected(self) -> bool:
        """Whether the SSH connection is still up (False after close or a drop)."""
        transport = self.client.get_transport()
        return transport is not None and transport.is_active()

    def _kill(self, pid: int | None) -> None:
        """Stop a remote command and its process group (best effort)."""
        if pid is None or pid <= 0 or not self.is_connected():
            return
        # TERM to the command's process group (the remote shell leads it), KILL
        # what is left after 3 s. `kill -SIG -PGID` is the form dash and bash accept.
        script = (
            'kill -TERM -"$1" 2>/dev/null || kill -TERM "$1" 2>/dev/null; i=0; '
            'while kill -0 -"$1" 2>/dev/null && [ "$i" -lt 30 ]; do sleep 0.1; i=$((i+1)); done; '
            'kill -KILL -"$1" 2>/dev/null; exit 0'
        )
        with contextlib.suppress(Exception):
            chan = self._transport().open_session()
            chan.exec_command(shlex.join(["sh", "-c", script, "sh", str(pid)]))
            chan.recv_exit_status()
            chan.close()
        self._running.discard(pid)

    def adopt(self, pid: int) -> None:
        """Stop ``pid``'s process group at ``close`` too: a command run detached
        (``orchestrator.providers.detached``), which outlives the channel that started it."""
        self._running.add(pid)

    def forget(self, pid: int) -> None:
        self._running.discard(pid)

    def stop_group(self, pid: int) -> None:
        """Stop an adopted command and its process group now (best effort)."""
        self._kill(pid)

    def check(self, argv: Sequence[str], *, what: str, timeout: float | None = None) -> str:
        """Run ``argv``; its stdout, or RemoteCommandError with the last stderr line."""
        result = self.run(argv, timeout=timeout)
        if result.exit_code != 0:
            reason = result.last_line(f"exit code {result.exit_code}")
            raise RemoteCommandError(f"{what} on {self.target.label} failed: {reason}")
        return result.stdout_tail

    def put(self, local: Path, remote: str) -> None:
        self._upload(remote, local.name, lambda sftp, tmp: sftp.put(str(local), tmp))

    def put_bytes(self, data: bytes, remote: str) -> None:
        """Like ``put``, from memory: no local disk needed."""
        self._upload(remote, posixpath.basename(remote),
                     lambda sftp, tmp: sftp.putfo(io.BytesIO(data), tmp))

    def _upload(self, remote: str, name: str, send: Callable[[Any, str], Any]) -> None:
        """Send to a temp name then rename, so a half-copied file is never seen as whole."""
        remote = self._abs(remote)
        sftp = self._sftp_client()
        tmp = f"{remote}.part-{os.getpid()}-{random.randrange(1 << 30)}"
        with self._errors(f"uploading {name}"):
            self._mkdirs(sftp, remote.rsplit("/", 1)[0] if "/" in remote else ".")
            send(sftp, tmp)
            sftp.posix_rename(tmp, remote)

    def get(self, remote: str, local: Path) -> None:
        remote = self._abs(remote)
        sftp = self._sftp_client()
        local = Path(local)
        try:
            with atomic_path(local) as tmp, open(tmp, "wb") as fh:
                try:  # the file's errors are the local disk's: raised as such
                    with self._errors(f"downloading {remote}"):
                        try:
                            sftp.getfo(remote, _LocalWrites(fh))
                        except FileNotFoundError:
                            raise FileNotFoundError(
                                f"{remote} does not exist on {self.target.label}"
                            ) from None
                except _LocalWriteError as exc:
                    raise exc.error from None
        except OSError as exc:
            if exc.errno is not None and exc.filename is None:
                exc.filename = str(local)  # which file could not be written
            raise

    @staticmethod
    def _mkdirs(sftp: Any, path: str) -> None:
        missing: list[str] = []
        while path not in ("", "/", "."):
            try:
                sftp.stat(path)
                break
            except FileNotFoundError:
                missing.append(path)
                path = path.rsplit("/", 1)[0] if "/" in path else ""
        for directory in reversed(missing):
            with contextlib.suppress(OSError):  # created meanwhile by a parallel sweep
                sftp.mkdir(directory)

    def host_facts(self) -> dict[str, object]:
        """vCPUs and memory of the host, read from it (nproc, /proc/meminfo)."""
        text = self.check(
            [
                "sh",
                "-c",
                "nproc 2>/dev/null || getconf _NPROCESSORS_ONLN; "
                "grep -m1 '^MemTotal:' /proc/meminfo",
            ],
            what="reading cores and memory",
            timeout=60,
        )
        vcpus: int | None = None
        memory_gib: float | None = None
        for line in text.splitlines():
            words = line.split()
            if len(words) == 1 and words[0].isdigit():
                vcpus = int(words[0])
            elif words[:1] == ["MemTotal:"] and len(words) >= 2 and words[1].isdigit():
                memory_gib = round(int(words[1]) / (1024 * 1024), 2)  # kB → GiB
        if vcpus is None or memory_gib is None:
            raise RemoteCommandError(
                f"cannot read cores and memory of {self.target.label} (not Linux?)"
            )
        return {"vcpus": vcpus, "memory_gib": memory_gib}

    def ensure_workloads(self, wheels: WheelSource | None = None) -> None:
        """Make ``python -m workloads.run`` runnable: reuse or build the venv for this wheel.

        The venv lives at ``<workdir>/env-<hash>`` (``--system-site-packages``, so
        numpy/pyarrow/psutil the image already has are reused). Its packages come
        from ``wheels``, the sweep's staged set (``orchestrator.providers.wheelhouse``),
        else, or when that fails, from the index. ``<workdir>/bootstrap.log`` records
        "install" (and from where) or "reuse" per sweep, which is how the tests see
        the second sweep skip it.
        """
        start = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="cloudprof-wheel-") as tmp:
            wheel, digest = workloads_wheel(Path(tmp))
            env = f"{self.workdir}/env-{digest}"
            state = self.run(
                ["sh", "-c", _REUSE_SCRIPT, "sh", self.workdir, env, digest, STARTUP_STATE_DIR],
                timeout=900,
            )
            if state.exit_code == 0:
                self.last_bootstrap = "reused"
            else:
                remote_wheel = f"{self.workdir}/wheels/{wheel.name}"
                self.put(wheel, remote_wheel)
                found = wheels.deliver(self, remote_wheel) if wheels is not None else None
                out = self.check(["sh", "-c", _INSTALL_SCRIPT, "sh", self.workdir, env, digest,
                                  remote_wheel, self.base_python, found or ""],
                                 what="installing the workloads wheel", timeout=1800)
                self.last_bootstrap = "installed"
                self.bootstrap_source = "staged" if "cloudprof-bootstrap staged" in out else "index"
                if wheels is not None:
                    wheels.installed(self, self.bootstrap_source, time.monotonic() - start)
        self.python = f"{env}/bin/python"

    def ensure_profiler(self, kind: str) -> str | None:
        """pip-install the profiler ``--profile kind`` needs into the trial env, only when asked.

        Called after ``ensure_workloads``; a host that already has it is left
        alone. A failed install does not stop the sweep: the trials run without
        a profile and say why, and this returns the one line to print now.
        """
        package, probe = PROFILER_PACKAGES[kind]
        return self._ensure_package(package, probe, "profiler")

    def ensure_ray(self) -> str | None:
        """pip-install Ray into the trial env (``ray start`` and ``import ray``), only when
        a multi-node sweep asks; a host that has it is left alone.

        Called after ``ensure_workloads``. Returns None, or the one line saying why
        the host cannot join a Ray cluster (the engine decides what that costs).
        """
        return self._ensure_package(RAY_REQUIREMENT, _RAY_PROBE, "ray")

    def _ensure_package(self, package: str, probe: str, what: str) -> str | None:
        """Install ``package`` into the trial env unless ``probe`` says it is there already;
        None, or one line saying why it could not be installed."""
        env_bin = posixpath.dirname(self.python)
        result = self.run(["sh", "-c", _PACKAGE_SCRIPT, "sh", self.python, env_bin, probe,
                           package, what], timeout=900)  # fmt: skip
        if result.exit_code == 0:
            return None
        why = result.last_line("no output")
        return f"cannot install {package} on {self.target.label}: {why}"

    def close(self) -> None:
        for pid in list(self._running):
            self._kill(pid)
        with contextlib.suppress(Exception):
            if self._sftp is not None:
                self._sftp.close()
        with contextlib.suppress(Exception):
            self.client.close()

    def reconnect(self, timeout: float = 120) -> SshExecutor:
        """A fresh executor to the same host (after ConnectionLostError)."""
        self.close()
        return open_ssh(self.target, timeout)
