"""The time-series writer a warm runner keeps beside it, for trials that have no pyarrow.

A trial's runner writes its time series (``timeseries.parquet``) once its trial is over.
In a command job's runner, or a built-in workload's that reads no Parquet, that write is
the runner's first use of pyarrow, and importing pyarrow (and numpy with it) was most
of what the runner cost besides the trial: 0.15 of the 0.2 CPU-seconds a forked runner
of a trivial command spent, and as much time between two trials. The server may not
import pyarrow itself: a forked trial starts with the server's pages, which must be a
fresh runner's (``workloads.warm``, "Peaks"), and a fresh runner of such a job has no
pyarrow when its trial starts.

So the server forks this process before any trial and pyarrow is imported here, after
the fork: the server's pages stay as they were. A runner forked from the server hands
it the series' rows and a temporary path beside the file; it writes the Parquet file
there and answers, and the runner syncs and renames it as it does its own writes
(``trial_results._atomic_write``). The bytes are those the runner would have written:
the same rows (``marshal`` keeps floats and ints exact) through the same table code.
Where the writer does not answer (not started, gone), the runner writes the file itself.

It listens on an abstract Unix socket beside the server's, serves only its own user
(``SO_PEERCRED``), and exits with the server (it watches the server's pidfd), so no sweep
leaves it behind.
"""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Callable, Sequence
from pathlib import Path

from workloads.warm_client import address, from_own_user, receive, send

SUFFIX = ".writer"  # after the server's name: the writer's socket


def start(name: str) -> int | None:
    """Start the writer for the server ``name`` (this process); its pid, or None.

    Forked twice, so that it is no child of the server: the server's descendants stay its
    trials alone (what a sweep and its tests count and kill). It watches the server's
    pidfd instead and exits with it."""
    server = os.getpid()
    read_end, write_end = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(read_end)
        os.close(write_end)
        return None
    if pid:
        os.close(write_end)
        os.waitpid(pid, 0)  # the middle process exits once it has forked the writer
        said = os.read(read_end, 32)  # once the writer listens (b"": it could not)
        os.close(read_end)
        return int(said) if said.strip().isdigit() else None
    code = 1  # pragma: no cover - the forked processes never return (os._exit)
    try:
        os.close(read_end)
        os.setsid()  # out of the server's group: a signal to it or a trial's never lands here
        code = 0 if os.fork() else _serve(name, server, write_end)  # the middle one: 0
    except BaseException:  # a writer that fails leaves the runners to write
        pass
    finally:
        os._exit(code)


def _serve(name: str, server: int, ready: int) -> int:
    """Listen, say so on ``ready`` (the server waits for it: its first trial finds the
    writer), then write what runners ask for until the server is gone."""
    import selectors

    try:
        gone = os.pidfd_open(server)
    except OSError:
        return 1  # the server went already
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.set_wakeup_fd(-1)
    os.chdir("/")  # not the host's workdir, where a sweep looks for what it left running
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # not the sweep's output: its end closing is how the server stops
        os.dup2(devnull, fd)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address(name + SUFFIX))  # before the import: a runner's request waits
    listener.listen(8)
    os.write(ready, str(os.getpid()).encode())
    low = 3  # close the rest: the server's listener, its wake-up pipe, its trials' sockets
    for keep in sorted((gone, listener.fileno())):
        os.closerange(low, keep)
        low = keep + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))
    import pyarrow.parquet  # noqa: F401 - what this process is for

    from workloads.trial_results import write_rows

    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    sel.register(gone, selectors.EVENT_READ)
    while True:
        for key, _ in sel.select():
            if key.fd == gone:
                return 0
            conn, _ = listener.accept()
            with conn:
                _answer(conn, write_rows)


def _answer(conn: socket.socket, write_rows: Callable[[Path, Sequence[tuple]], None]) -> None:
    try:
        conn.settimeout(60)
        if not from_own_user(conn):
            return
        request, _fds = receive(conn)
        write_rows(Path(str(request["path"])), request["rows"])  # type: ignore[arg-type]
        conn.sendall(b"ok\n")
    except Exception:  # no answer: the runner writes the file itself, as without a writer
        return


def write(name: str, path: Path, rows: Sequence[tuple]) -> bool:
    """In a trial's runner: have the writer of server ``name`` write ``rows`` to ``path``;
    False where it did not (the caller writes the file itself)."""
    from workloads.warm_client import connect

    sock = connect(name + SUFFIX)
    if sock is None:
        return False
    try:
        send(sock, {"path": str(path), "rows": list(rows)}, [])
        reply = b""
        while not reply.endswith(b"\n"):
            more = sock.recv(16)
            if not more:
                return False
            reply += more
        return reply == b"ok\n"
    except (OSError, ValueError):  # gone, or rows marshal cannot carry
        return False
    finally:
        sock.close()
