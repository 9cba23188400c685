"""The warm runner's client (``workloads.warm``): one per trial, and the ``stop`` command.

Why a module of its own: a client starts once per trial, on the trial's critical
path, and its interpreter start is cloudprof's overhead. It imports only what it
needs before its request is on its way: os, sys, marshal, struct and ``_socket``,
the C socket that ``socket.socket`` wraps (the ``socket`` module pulls enum and
selectors: a 15 ms interpreter start became 34 ms with it, 24 ms with ``_socket``
here; the server's own module, 56 ms). ``signal`` follows while the server forks
the trial. Requests go as ``marshal``
(a builtin, nothing to import): client and server run the same interpreter
(``Executor.python``), the only case ``marshal`` is made for, and the server
reads requests from its own user only (SO_PEERCRED).

Command lines (see ``CLIENT``)::

    python -S -c CLIENT ROOT run NAME -- RUNNER_ARGS
    python -S -c CLIENT ROOT stop NAME
"""

from __future__ import annotations

import _socket
import marshal
import os
import struct
import sys
from array import array

HEADER = struct.Struct("!I")

# A client's command line, ``python -S -c CLIENT ROOT run NAME -- ARGS``: without ``site``
# (a third of an interpreter's start, with an editable install's finder) and runpy, since
# a client imports only the standard library; ROOT is where the server found this package.
CLIENT = ("import sys; sys.path.insert(0, sys.argv.pop(1)); "
          "from workloads.warm_client import main; sys.exit(main(sys.argv[1:]))")


def address(name: str) -> str:
    """The server's abstract Unix socket: no file to leave behind, gone with the server."""
    return "\0cloudprof-warm-" + name


def connect(name: str) -> _socket.socket | None:
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.connect(address(name))
    except OSError:
        sock.close()
        return None
    return sock


def send(sock: _socket.socket, request: dict[str, object], fds: list[int]) -> None:
    """One request, framed by its length, with ``fds`` passed along (SCM_RIGHTS)."""
    body = marshal.dumps(request)
    ancillary = [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, array("i", fds))] if fds else []
    sock.sendmsg([HEADER.pack(len(body)) + body], ancillary)


def from_own_user(conn: _socket.socket) -> bool:
    """Whether the peer of an accepted ``conn`` runs as this process's user (SO_PEERCRED):
    the server and its writer serve no one else."""
    creds = conn.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1] == os.getuid()


def receive(conn: _socket.socket) -> tuple[dict[str, object], list[int]]:
    """The server's side of ``send``: the request and the descriptors that came with it."""
    import socket

    data, fds, _flags, _addr = socket.recv_fds(conn, 65536, 8)
    if len(data) < HEADER.size:
        raise ValueError("short request")
    (size,) = HEADER.unpack_from(data)
    body = bytearray(data[HEADER.size:])
    while len(body) < size:
        more = conn.recv(size - len(body))
        if not more:
            raise ValueError("truncated request")
        body += more
    request = marshal.loads(bytes(body))
    if not isinstance(request, dict):
        raise ValueError("a request is a dict")
    return request, list(fds)


class _Replies:
    """The server's replies, a line at a time, split into words; [] once it has closed."""

    def __init__(self, sock: _socket.socket) -> None:
        self.sock, self.buf = sock, b""

    def next(self) -> list[str]:
        while b"\n" not in self.buf:
            try:
                more = self.sock.recv(256)
            except OSError:
                more = b""
            if not more:
                return []
            self.buf += more
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode("utf-8", "replace").split()


def kill_group(pid: int, sig: int) -> None:
    """Signal a trial's process group (its workers, its sampler), or the process alone."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, sig)
            return
        except ProcessLookupError:
            continue
        except PermissionError:
            return


LOST = "error: the warm runner stopped during the trial"
"""The line a trial's caller writes when the server died under the trial (which it kills)."""


class Trial:
    """One trial that a warm runner forks: the request on its way, the server's replies.

    The one implementation of the protocol's trial side, for the client process (``client``)
    and for an engine that talks to a server on its own host (``LocalExecutor``)."""

    def __init__(self, sock: _socket.socket) -> None:
        self.sock = sock
        self.replies = _Replies(sock)
        self.pid: int | None = None

    @classmethod
    def request(cls, name: str, argv: list[str], cwd: str, env: dict[str, str],
                fds: list[int]) -> Trial | None:  # fmt: skip
        """Ask the server to fork the runner with ``argv`` in ``cwd`` with ``env``, on ``fds``
        as its stdin, stdout and stderr; None when no server takes the request."""
        sock = connect(name)
        if sock is None:
            return None
        try:
            send(sock, {"op": "run", "argv": argv, "cwd": cwd, "env": env}, fds)
        except OSError:
            sock.close()
            return None
        return cls(sock)

    def started(self) -> bool:
        """Whether the server forked the trial (``pid`` is then its process group); False:
        the server is stopping, the caller starts a fresh runner instead."""
        first = self.replies.next()
        if len(first) != 2 or first[0] != "pid":
            self.sock.close()
            return False
        self.pid = int(first[1])
        return True

    def signal(self, sig: int) -> None:
        """Signal the trial's process group, as a fresh runner's group would be signalled."""
        assert self.pid is not None
        kill_group(self.pid, sig)

    def outcome(self) -> tuple[str, int]:
        """Wait for the trial's end: ("exit", code), ("signal", number), or ("lost", 1) when
        the server died under it, which then kills the trial's group (never left running
        unwatched). A signal that interrupts the wait is handled and the wait resumes."""
        last = self.replies.next()
        self.sock.close()
        if len(last) == 2 and last[0] in ("exit", "signal"):
            return last[0], int(last[1])
        import signal

        self.signal(signal.SIGKILL)
        return "lost", 1


def _fresh_runner(argv: list[str]) -> None:
    os.execv(sys.executable, [sys.executable, "-m", "workloads.run", *argv])


def client(name: str, argv: list[str]) -> int:
    """Run one trial in the server's fork, as if this process were the runner."""
    trial = Trial.request(name, argv, os.getcwd(), dict(os.environ), [0, 1, 2])
    if trial is None:
        _fresh_runner(argv)
    assert trial is not None
    import signal  # while the server forks: off the request's path

    if not trial.started():  # the server is stopping: start fresh instead
        _fresh_runner(argv)

    def forward(signum: int, _frame: object) -> None:
        trial.signal(signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    how, value = trial.outcome()  # a forwarded signal interrupts the wait: PEP 475 retries it
    if how == "exit":
        return value
    if how == "signal":
        signal.signal(value, signal.SIG_DFL)
        os.kill(os.getpid(), value)
        return 128 + value
    print(LOST, file=sys.stderr, flush=True)
    return value


def client_args(argv: list[str]) -> list[str] | None:
    """The client's own arguments (``run NAME -- ARGS`` or ``stop NAME``) in a command line
    that starts it (``python -S -c CLIENT ROOT ...`` or ``python -m workloads.warm ...``);
    None for any other command."""
    if len(argv) >= 5 and argv[1:4] == ["-S", "-c", CLIENT]:
        args = argv[5:]
    elif len(argv) >= 3 and argv[1:3] == ["-m", "workloads.warm"]:
        args = argv[3:]
    else:
        return None
    if (len(args) >= 3 and args[0] == "run" and args[2] == "--") or (
            len(args) == 2 and args[0] == "stop"):  # fmt: skip
        return args
    return None


def stop(name: str) -> int:
    """Ask the server to exit once its trials have; returns at once (0 if none runs)."""
    sock = connect(name)
    if sock is None:
        return 0
    try:
        send(sock, {"op": "stop"}, [])
        sock.recv(64)
    finally:
        sock.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) >= 3 and args[0] == "run" and args[2] == "--":
        return client(args[1], args[3:])
    if len(args) == 2 and args[0] == "stop":
        return stop(args[1])
    print("usage: python -m workloads.warm serve NAME [--preload WORKLOAD] | run NAME -- ARGS"
          " | stop NAME", file=sys.stderr)
    return 2
