"""A warm runner: one process per host that has done the runner's imports and forks each trial.

    python -m workloads.warm serve NAME [--preload WORKLOAD]  # once per host, in the background
    python -m workloads.warm run NAME -- RUNNER-ARGS...   # per trial: as `-m workloads.run ARGS`
    python -m workloads.warm stop NAME                    # when the host's trials are done

(The engine runs the last two through ``workloads.warm_client.CLIENT``, which starts
in a third of the time: see that module; on a local host it sends the client's
request itself, with the client's code, and starts no process at all.)

Why: a trial's runner is a fresh interpreter that imports numpy, pyarrow and the
runner before its clock starts — ~0.25 s a trial that is neither the workload's
work nor a measurement. Here a server pays that once; each trial is a child
forked from it, which runs ``workloads.run.main`` exactly as a fresh process would.

What keeps the measurements those of a fresh process:

- *Peaks.* A forked child's high-water mark (VmHWM, ``ru_maxrss``) starts at its
  own RSS, and the kernel does not copy the page-table entries of read-only file
  mappings (the libraries' code) into it: they are mapped again only when
  touched. So the child first maps every file page that was resident in the
  server (listed once from ``/proc/self/pagemap``), making its RSS the server's,
  which is what a fresh runner's RSS is after the same imports; and the server's
  own import-time peak is the floor of the child's load-phase peak
  (``workloads.agent.IMPORTS_PEAK_BYTES``), because a fresh process's VmHWM
  would hold it. The server imports only what the runner imports for this
  workload (``--preload``: a built-in workload's module, never the user's code).
- *The sampler.* The trial's agent asks the server for its sampler process
  (``spawn_sampler``): forked, in the trial's process group, on the trial's
  pipes and shared-memory counters — the same code, without its own
  interpreter start (~0.1 s a trial).
- *Everything else is per trial*: the client's argv, working directory,
  environment and stdin/stdout/stderr (passed as file descriptors), fresh
  random seeds, default signal handlers, its own process group.
- *Signals and exit.* The client forwards SIGINT/SIGTERM/SIGHUP to the child's
  process group (as they reached a fresh runner's group), and exits with the
  child's exit code, or dies of the child's signal. A client killed outright
  (SIGKILL) closes its connection and the server kills the child's group.

The client falls back to ``python -m workloads.run`` (``os.execv``) when no
server answers, so a server that did not start costs nothing but its speed.
The server listens on an abstract Unix socket (no file to clean up, no path
length limit) and serves only its own user (``SO_PEERCRED``); it exits on
``stop``, on SIGINT/SIGTERM once its running trials end, when its parent goes
away or stops reading its output (an SSH session that died), or after
``IDLE_EXIT_S`` without a trial.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import resource
import selectors
import signal
import socket
import struct
import sys
import time
from typing import Any

from workloads import warm_writer
from workloads.warm_client import address, connect, from_own_user, kill_group, receive, send
from workloads.warm_client import main as client_main

IDLE_EXIT_S = 900.0  # a server nobody uses (its sweep died without `stop`) goes away
_TOUCH_CHUNK = 64 * 1024
MADV_POPULATE_READ = 22  # <linux/mman.h>, Linux >= 5.14; Python's mmap names it from 3.14 on


# -- the server ---------------------------------------------------------------------------


def resident_file_pages() -> list[tuple[int, int]]:
    """(address, length) runs of this process's file-backed pages that are mapped now.

    The present bit of ``/proc/self/pagemap`` is readable by the process itself
    without privileges (only the frame numbers are hidden).
    """
    page = os.sysconf("SC_PAGE_SIZE")
    runs: list[tuple[int, int]] = []
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps, \
            open("/proc/self/pagemap", "rb", buffering=0) as pagemap:  # fmt: skip
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) < 6 or not fields[5].startswith("/") or fields[1][0] != "r":
                continue  # anonymous, special ([heap], [vdso]...) or unreadable
            start, end = (int(x, 16) for x in fields[0].split("-"))
            pagemap.seek(start // page * 8)
            data = pagemap.read((end - start) // page * 8)
            run_start = None
            for i, (entry,) in enumerate(struct.iter_unpack("<Q", data)):
                addr = start + i * page
                if entry >> 63:  # present
                    if run_start is None:
                        run_start = addr
                elif run_start is not None:
                    runs.append((run_start, addr - run_start))
                    run_start = None
            if run_start is not None:
                runs.append((run_start, start + len(data) // 8 * page - run_start))
    return runs


def touch_pages(runs: list[tuple[int, int]], populate: Any = None) -> None:
    """Map these pages into this process: its RSS then counts them, as the server's does.

    ``populate``: ``madvise`` from :func:`page_populator`, which maps each run in one
    call (``MADV_POPULATE_READ``, Linux >= 5.14), copying no byte; the same RSS
    (``tests/test_warm_runner.py`` checks both ways). Without it, or for a run it
    refuses, a read through ``/proc/self/mem`` faults the
    pages it covers into this process's page tables (the kernel's get_user_pages),
    64 KiB a call into one reused buffer.
    """
    todo = runs
    if populate is not None:
        todo = [(addr, length) for addr, length in runs
                if populate(addr, length, MADV_POPULATE_READ) != 0]  # fmt: skip
        if not todo:
            return
    buf = memoryview(bytearray(_TOUCH_CHUNK))  # reused: no transient allocation in the peak
    fd = os.open("/proc/self/mem", os.O_RDONLY)
    try:
        for addr, length in todo:
            for offset in range(addr, addr + length, _TOUCH_CHUNK):
                try:
                    os.preadv(fd, [buf[: min(_TOUCH_CHUNK, addr + length - offset)]], offset)
                except OSError:  # a mapping gone since the list was made
                    break
    finally:
        os.close(fd)


def page_populator() -> Any:
    """libc's ``madvise`` where it can populate page tables (None: touch them instead).

    Only through a ``ctypes`` that the runner's imports already hold (numpy imports it): a
    module imported for this alone would be in every forked trial's RSS and not in a fresh
    runner's. Checked once on a page of this process: kernels before 5.14 answer EINVAL.
    """
    ctypes = sys.modules.get("ctypes")
    if ctypes is None:
        return None
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    page = os.sysconf("SC_PAGE_SIZE")
    probe = ctypes.create_string_buffer(2 * page)
    start = (ctypes.addressof(probe) + page - 1) // page * page  # a page inside the buffer
    return madvise if madvise(start, page, MADV_POPULATE_READ) == 0 else None


class _Trial:
    """One forked trial: the client's connection, the child's pidfd, and for a runner the
    pipe on which it says its exit code just before it exits (``done``)."""

    def __init__(self, conn: socket.socket, pid: int, pidfd: int, done: int | None) -> None:
        self.conn, self.pid, self.pidfd, self.done = conn, pid, pidfd, done
        self.replied = False  # the client has its exit code; the process may still be exiting


class Server:
    def __init__(self, name: str, preload: str | None) -> None:
        self.name = name
        self.preload = preload
        self.trials: dict[int, _Trial] = {}  # by pidfd
        self.stopping = False
        self.parent = os.getppid()
        self.pages: list[tuple[int, int]] = []
        self.populate: Any = None  # madvise, where it maps pages (see touch_pages)
        self.imports_peak = 0
        self.writer: int | None = None  # the time series' writer (workloads.warm_writer)

    def warm_up(self) -> None:
        """The runner's imports (and the workload's module), then what children inherit."""
        import importlib

        # workloads.transfer: what a trial's --put imports after its clock (8-20 ms a trial
        # in a fork), paid here once
        import workloads.run
        import workloads.transfer
        from workloads import procfs
        from workloads.base import REGISTRY, load_workload

        if self.preload in REGISTRY:  # a built-in: never the user's code
            for module in load_workload(self.preload).preload:
                importlib.import_module(module)
        # What every runner does before prepare(), done here once for all of them: the host's
        # facts (the static ones kept) and its parser. Not the result writer's first write:
        # see run._warm_result_writer
        from workloads.hostinfo import host_facts

        host_facts()
        workloads.run.parser()
        self.populate = page_populator()
        self.pages = resident_file_pages()
        self.imports_peak = procfs.read_hwm("self") or 0
        if "pyarrow" not in sys.modules:  # a runner would import it for its time series alone
            self.writer = warm_writer.start(self.name)

    def serve(self) -> int:
        try:
            os.pidfd_open  # noqa: B018 - Linux >= 5.3, Python >= 3.9
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(address(self.name))
        except (AttributeError, OSError) as exc:
            print(f"warm runner unavailable: {exc}", flush=True)
            return 0
        listener.listen(8)
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        self.warm_up()
        sel = selectors.DefaultSelector()
        sel.register(listener, selectors.EVENT_READ, "accept")
        sel.register(wake_r, selectors.EVENT_READ, "wake")
        # where this package lives: the engine's clients import it from there without `site`
        print(f"ready {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}", flush=True)
        idle_since = time.monotonic()
        try:
            while not (self.stopping and not self.trials):
                for key, _ in sel.select(timeout=5.0):
                    if key.data == "accept":
                        self._accept(listener, sel)
                    elif key.data == "wake":
                        os.read(wake_r, 512)
                    elif isinstance(key.data, _Trial):
                        self._trial_event(key, sel)
                if self.trials:
                    idle_since = time.monotonic()
                elif (os.getppid() != self.parent or _output_closed()
                      or time.monotonic() - idle_since > IDLE_EXIT_S):
                    self.stopping = True  # the sweep is gone (or its SSH session): so are we
                if self.stopping and "accept" in {k.data for k in sel.get_map().values()}:
                    sel.unregister(listener)
                    listener.close()
        finally:
            for trial in list(self.trials.values()):  # never leave a trial running
                kill_group(trial.pid, signal.SIGKILL)
        return 0

    def _on_signal(self, _signum: int, _frame: Any) -> None:
        self.stopping = True  # the clients forward signals to their trials; not here too

    def _accept(self, listener: socket.socket, sel: selectors.BaseSelector) -> None:
        conn, _ = listener.accept()
        try:
            if not from_own_user(conn):
                conn.close()
                return
            request, fds = receive(conn)
        except (OSError, ValueError):
            conn.close()
            return
        if request.get("op") == "stop":
            self.stopping = True
            conn.sendall(b"stopping\n")
            conn.close()
            return
        runner = request.get("op") != "sampler"
        if runner:  # a trial never starts beside the previous one's exit (its memory freed)
            self._reap_exiting(sel)
        done_r, done_w = os.pipe() if runner else (-1, -1)
        sys.stdout.flush()
        sys.stderr.flush()
        forked_at = time.monotonic()  # the trial's load phase starts here (run.FORKED_AT)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child never returns here (os._exit)
            if not runner:
                _sampler_child(request, fds)
            os.close(done_r)
            _child(request, fds, conn, self, forked_at, done_w)
        for fd in fds:
            os.close(fd)
        if runner:
            os.close(done_w)
        pidfd = os.pidfd_open(pid)
        trial = _Trial(conn, pid, pidfd, done_r if runner else None)
        self.trials[pidfd] = trial
        conn.sendall(f"pid {pid}\n".encode())
        sel.register(pidfd, selectors.EVENT_READ, trial)
        sel.register(conn, selectors.EVENT_READ, trial)
        if trial.done is not None:
            sel.register(trial.done, selectors.EVENT_READ, trial)

    def _trial_event(self, key: selectors.SelectorKey, sel: selectors.BaseSelector) -> None:
        trial: _Trial = key.data
        if self.trials.get(trial.pidfd) is not trial:
            return  # both its events came in one batch: already reaped
        if key.fd == trial.done:  # the runner's exit code, its last word before it exits
            said = os.read(trial.done, 16).strip()
            sel.unregister(trial.done)
            os.close(trial.done)
            trial.done = None
            if said.lstrip(b"-").isdigit():  # else it died before a word: its pidfd tells
                self._reply(trial, f"exit {int(said)}\n", sel)
            return
        if key.fileobj is trial.conn:  # the client went away (killed): so does its trial
            try:
                if trial.conn.recv(64):
                    return  # nothing else is expected from a client; ignore it
            except OSError:
                pass
            kill_group(trial.pid, signal.SIGKILL)
        _, status = os.waitpid(trial.pid, 0)
        self._forget(trial, sel)
        if os.WIFSIGNALED(status):
            self._reply(trial, f"signal {os.WTERMSIG(status)}\n", sel)
        else:
            self._reply(trial, f"exit {os.waitstatus_to_exitcode(status)}\n", sel)

    def _reply(self, trial: _Trial, line: str, sel: selectors.BaseSelector) -> None:
        """The trial's end, to its client (once): its exit code, or the signal it died of."""
        if trial.replied:
            return
        trial.replied = True
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(trial.conn)
        with contextlib.suppress(OSError):
            trial.conn.sendall(line.encode())
        trial.conn.close()

    def _forget(self, trial: _Trial, sel: selectors.BaseSelector) -> None:
        """A reaped trial: its pidfd and its pipe closed, its entry gone."""
        sel.unregister(trial.pidfd)
        os.close(trial.pidfd)
        if trial.done is not None:
            sel.unregister(trial.done)
            os.close(trial.done)
            trial.done = None
        del self.trials[trial.pidfd]

    def _reap_exiting(self, sel: selectors.BaseSelector) -> None:
        """Wait for the trials that said their exit code and are still exiting (freeing their
        memory), so that nothing runs beside the next one.
        Their clients had the code at once: the sweep records while they exit."""
        for trial in [t for t in self.trials.values() if t.replied]:
            os.waitpid(trial.pid, 0)
            self._forget(trial, sel)


def _output_closed() -> bool:
    """Whether nobody reads our stdout any more: the sweep's end of it (a pipe in the
    sweep's process, an SSH session's channel) is gone, even if our parent is not."""
    import select

    poll = select.poll()
    poll.register(sys.stdout.fileno(), 0)  # errors and hang-ups are always reported
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poll.poll(0))


def _child(request: dict[str, Any], fds: list[int], conn: socket.socket, server: Server,
           forked_at: float, done: int) -> None:
    """In the forked child: become the trial's process, run the runner, exit with its code.

    ``forked_at``: the server's ``time.monotonic()`` just before the fork, where the trial's
    load phase (``load_s``) starts, exactly; /proc would give it only to a 10 ms tick.
    ``done``: where it writes its exit code once everything is written and its output
    closed, just before it exits: the server tells the client then, and forks no other
    trial before this process is gone."""
    code = 1
    try:
        os.setpgid(0, 0)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)
        for fd in fds:
            os.close(fd)
        conn.close()
        # the listener, the selector, other trials' connections (close_range: one syscall
        # each side of ``done``)
        os.closerange(3, done)
        os.closerange(done + 1, os.sysconf("SC_OPEN_MAX"))
        touch_pages(server.pages, server.populate)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        _fresh_seeds()
        from workloads import agent, run

        agent.IMPORTS_PEAK_BYTES = server.imports_peak
        agent.SPAWN_SAMPLER = lambda config, fds: spawn_sampler(server.name, config, fds)
        if server.writer is not None:
            from workloads import trial_results

            trial_results.WRITER = lambda path, rows: warm_writer.write(server.name, path, rows)
        run.STARTED_AS = "forked from a warm runner"
        run.FORKED_AT = forked_at
        sys.argv = [run.__file__, *request["argv"]]
        code = run.main(request["argv"])
        _exit_functions()
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        with contextlib.suppress(OSError):
            os.closerange(0, 3)  # the caller's end of the output sees its end now
            os.write(done, f"{code}\n".encode())
        os._exit(code)


def _fresh_seeds() -> None:
    """What a fresh process would get: ``random`` reseeds itself at fork; numpy's does not."""
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()


def _exit_functions() -> None:
    """A fresh process's exit: wait for its non-daemon threads, run its atexit hooks."""
    import atexit
    import threading

    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()


def _sampler_child(request: dict[str, Any], fds: list[int]) -> None:
    """In a forked child: the trial's sampler (``workloads.sampler_process``, less the
    interpreter's start and imports), in the trial's process group, on the trial's pipes."""
    code = 1
    try:
        os.setpgid(0, int(request["pgid"]))
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        # stdin, stdout, stderr, then the shared-memory fds at the numbers its config names
        targets = [0, 1, 2, *(int(n) for n in request["fd_numbers"])]
        # Parked above every target and below the soft limit on open files, which is 1024
        # in a cloud VM's SSH session (pam_limits): F_DUPFD 1024 fails there (EINVAL).
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        park = 1024 if soft == resource.RLIM_INFINITY else min(1024, soft - len(fds))
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, park) for fd in fds]
        os.closerange(0, park)
        for fd, target in zip(high, targets, strict=True):
            os.dup2(fd, target)
            os.close(fd)
        from workloads import sampler_process as sampler

        code = sampler.main(request["argv"])
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        os._exit(code)


# -- the client ---------------------------------------------------------------------------


def _connect(name: str) -> socket.socket | None:
    """A connection to the server as a full ``socket.socket`` (the trial's side: makefile,
    select), from the client's lean one."""
    raw = connect(name)
    return None if raw is None else socket.socket(fileno=raw.detach())


class ForkedProcess:
    """What ``subprocess.Popen`` gives the agent, for a sampler the server forked.

    It is not this process's child: its exit status comes from the server on the
    request's connection (which, closed, also tells the server to kill it).
    """

    def __init__(self, pid: int, stdin: int, stdout: int, conn: socket.socket) -> None:
        self.pid = pid
        self.stdin = os.fdopen(stdin, "wb")
        self.stdout = os.fdopen(stdout, "rb")
        self.returncode: int | None = None
        self._conn = conn
        self._status = conn.makefile("r", encoding="utf-8")

    def wait(self, timeout: float | None = None) -> int:
        import select
        import subprocess

        if self.returncode is None:
            if not select.select([self._conn], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(["workloads.sampler"], timeout or 0)
            words = self._status.readline().split()
            if len(words) == 2 and words[0] == "exit":
                self.returncode = int(words[1])
            elif len(words) == 2 and words[0] == "signal":
                self.returncode = -int(words[1])
            else:  # the server went away: its children went with it
                self.returncode = -signal.SIGKILL
            self._conn.close()
        return self.returncode

    def poll(self) -> int | None:
        try:
            return self.wait(0)
        except Exception:
            return None

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)


def spawn_sampler(name: str, config: str, fds: list[int]) -> ForkedProcess | None:
    """The trial's sampler, forked by the server (None: start one the usual way)."""
    sock = _connect(name)
    if sock is None:
        return None
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    try:
        send(sock, {"op": "sampler", "argv": [config], "pgid": os.getpgrp(),
                     "fd_numbers": fds}, [in_r, out_w, 2, *fds])  # fmt: skip
        first = sock.makefile("r", encoding="utf-8").readline().split()
    except OSError:
        first = []
    finally:
        os.close(in_r)
        os.close(out_w)
    if len(first) != 2 or first[0] != "pid":
        sock.close()
        os.close(in_w)
        os.close(out_r)
        return None
    return ForkedProcess(int(first[1]), in_w, out_r, sock)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) >= 2 and args[0] == "serve":
        preload = None
        if len(args) == 4 and args[2] == "--preload":
            preload = args[3]
        code = Server(args[1], preload).serve()
        # No trial runs any more and nothing is left to write: skip the interpreter's
        # teardown of numpy and pyarrow (~50 ms on the engine's wait for the stop)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return client_main(args)  # run, stop, or the usage line


if __name__ == "__main__":
    raise SystemExit(main())
