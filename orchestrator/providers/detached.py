"""A trial's runner detached from the SSH session that started it, and reattached after a drop.

Why: a trial run as a plain command of an SSH channel dies with the channel (its
output pipes close under it), so a dropped session — a flaky network, a laptop
waking from sleep, sshd restarting — cost the trial in flight, and the engine ran
it again from the start. Here the runner is started in its own session
(``setsid``) with stdin from ``/dev/null`` and its output and exit status in
files beside the trial's result directory on the host::

    <out_dir>.session/pid      the session leader's pid (= the runner's process group)
    <out_dir>.session/output   the runner's stdout and stderr, merged
    <out_dir>.session/status   its exit status, written once it ended (128+N: signal N)

One SSH command follows ``output`` until the runner ends; when the
connection drops, the engine's ``reconnect`` logs in again with backoff, and the
follower resumes after the last line it passed on, so the sweep sees each line
once and the trial runs once. It keeps trying for the reconnect budget (``patience``,
the sweep's ``CLOUDPROF_SSH_BOOT_TIMEOUT``) and never past the trial's own time
limit: a host that died would otherwise hold the sweep for the whole limit (4 x the
trial's length + 2 min, hours for a long trial). A connection that does not come
back within them fails the trial as a lost connection always did.

Timeouts, Ctrl-C and ``close`` stop the runner's whole process group as they stop
any command of the executor. Only an :class:`~orchestrator.providers.remote.SshExecutor`
detaches: a local subprocess has no session to lose.
"""

from __future__ import annotations

import posixpath
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from orchestrator.errors import (
    ConnectionLostError,
    RemoteCommandError,
    UnreachableError,
    one_line,
)
from orchestrator.providers.base import CommandResult, Executor

if TYPE_CHECKING:
    from orchestrator.providers.remote import SshExecutor

TAIL_LINES = 40
REATTACH_BACKOFF_S = (1.0, 30.0)  # first wait between reconnects, and the most

# $1 the session dir, then the command. The inner sh writes its pid (it leads the new
# session and process group), runs the command, then its status (both by rename, so a
# reader never sees half a number) and the end mark, on a line of its own. The outer sh
# returns once the pid is on disk.
END_MARK = "cloudprof-detached-end-of-output"  # the inner sh's last line of ``output``
_LAUNCH = r"""
d=$1; shift
mkdir -p "$d" && rm -f "$d/pid" "$d/status" && : > "$d/output" || exit 2
setsid sh -c 'echo $$ > "$0/pid.part" && mv "$0/pid.part" "$0/pid"
"$@" < /dev/null >> "$0/output" 2>&1
echo $? > "$0/status.part"; mv "$0/status.part" "$0/status"
[ -z "$(tail -c 1 "$0/output")" ] || echo >> "$0/output"
echo __END__ >> "$0/output"' "$d" "$@" \
    < /dev/null > /dev/null 2>&1 &
i=0
while [ ! -s "$d/pid" ]; do
    i=$((i + 1))
    if [ "$i" -gt 400 ]; then echo "the detached runner did not start" >&2; exit 2; fi
    sleep 0.05
done
cat "$d/pid"
""".replace("__END__", END_MARK)

# $1 the session dir, $2 the first line to pass on. ``tail -f`` passes lines on as they come
# (inotify) and sed ends the follow at the end mark, then stops tail: nothing polls while
# the trial runs, so the follower costs the measured host nothing. A runner killed outright
# writes no mark: a watchdog that looks every 5 s stops tail 2 s after the session leader
# is gone (or a zombie no init reaps), when tail has passed everything on.
_FOLLOW = r"""
pid=$(cat "$1/pid") || exit 2
tp="$1/tail.$$"
: > "$tp"
(
    while sleep 5; do
        state=""
        read -r state 2>/dev/null < "/proc/$pid/stat"
        case "$state" in
            ""|*") Z "*|*") X "*) sleep 2; read -r t < "$tp"; kill "$t"; exit 0 ;;
        esac
    done
) > /dev/null 2>&1 &
w=$!
{ tail -n "+$2" -f "$1/output" 2>/dev/null & echo $! > "$tp"; wait; } |
    { sed -u '/^__END__$/Q'; read -r t < "$tp"; kill "$t" 2>/dev/null; }
kill "$w" 2>/dev/null
rm -f "$tp"
exit 0
""".replace("__END__", END_MARK)


def session_dir(out_dir: str) -> str:
    """Where a trial's detached runner keeps its pid, output and status on the host."""
    return f"{out_dir.rstrip('/')}.session"


def run(
    ex: Executor,
    argv: Sequence[str],
    out_dir: str,
    *,
    timeout: float,
    on_line: Callable[[str], None],
    reconnect: Callable[[], Executor],
    stop: threading.Event,
    log: Callable[[str], None],
    patience: float | None = None,
) -> CommandResult:
    """Run ``argv`` on the host as ``ex.run`` would, surviving a dropped SSH session.

    ``reconnect`` logs in to the same host again (the engine's own connect, which also
    makes the new executor the host's); ``stop`` is the sweep's interrupt, after which
    a lost connection is not worth reattaching to; ``patience`` how long after a drop
    to keep reconnecting (None: until the time limit).
    """
    from orchestrator.providers.remote import SshExecutor

    if not isinstance(ex, SshExecutor):
        return ex.run(argv, timeout=timeout, on_line=on_line)
    deadline = time.monotonic() + timeout
    where = session_dir(out_dir)
    ssh: SshExecutor = ex
    pid: int | None = None  # the runner's, once started
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    passed = 0

    def counted(line: str) -> None:
        nonlocal passed
        passed += 1
        tail.append(line)
        on_line(line)

    try:
        while True:
            try:
                if pid is None:
                    pid = _launch(ssh, argv, where)
                remaining = max(1.0, deadline - time.monotonic())
                ssh.run(["sh", "-c", _FOLLOW, "sh", where, str(passed + 1)],
                        timeout=remaining, on_line=counted)
                code = _status(ssh, where)
                return CommandResult(code, "", "\n".join(tail))
            except ConnectionLostError as lost:
                if stop.is_set():
                    raise
                log(f"connection lost: {one_line(lost)}; reconnecting to the trial, "
                    "which runs on")
                give_up = deadline if patience is None else min(
                    deadline, time.monotonic() + patience)
                ssh = _reattach(reconnect, give_up, stop, lost)
                if pid is None:  # the drop cut the start short: did the runner start?
                    pid = _started(ssh, where)
                if pid is not None:
                    ssh.adopt(pid)
                    log(f"reattached to the trial on {ssh.target.label} (runner pid {pid})")
    except BaseException:  # a timeout, Ctrl-C, a lost host: never leave the runner running
        if pid is not None:
            ssh.stop_group(pid)
        raise
    finally:
        if pid is not None:
            ssh.forget(pid)


def _launch(ex: SshExecutor, argv: Sequence[str], where: str) -> int:
    """Start the runner in its own session on the host; its pid (= its process group)."""
    result = ex.run(["sh", "-c", _LAUNCH, "sh", where, *(str(a) for a in argv)], timeout=60)
    words = result.stdout_tail.split()
    if result.exit_code != 0 or not words or not words[-1].isdigit():
        reason = result.last_line(f"exit code {result.exit_code}")
        raise RemoteCommandError(f"starting {argv[0]} on {ex.target.label} failed: {reason}")
    pid = int(words[-1])
    ex.adopt(pid)
    return pid


def _started(ex: SshExecutor, where: str) -> int | None:
    """The pid a start cut short by a drop left on the host; None: start it (again)."""
    result = ex.run(["cat", posixpath.join(where, "pid")], timeout=60)
    text = result.stdout_tail.strip()
    return int(text) if result.exit_code == 0 and text.isdigit() else None


def _status(ex: SshExecutor, where: str) -> int:
    """The runner's exit status; -1 when it left none (its shell was killed outright)."""
    result = ex.run(["cat", posixpath.join(where, "status")], timeout=60)
    text = result.stdout_tail.strip()
    return int(text) if result.exit_code == 0 and text.isdigit() else -1


def _reattach(reconnect: Callable[[], Executor], deadline: float, stop: threading.Event,
              lost: ConnectionLostError) -> SshExecutor:
    """Log in again, with backoff, until ``deadline``; the last error past it."""
    from orchestrator.providers.remote import SshExecutor

    delay, most = REATTACH_BACKOFF_S
    last: Exception = lost
    while not stop.is_set():
        try:
            ex = reconnect()
        except (ConnectionLostError, UnreachableError) as exc:
            last = exc
        else:
            if isinstance(ex, SshExecutor):
                return ex
            raise TypeError(f"reconnect gave {type(ex).__name__}, not an SSH executor")
        if time.monotonic() + delay > deadline:
            break
        stop.wait(delay)
        delay = min(most, delay * 2)
    raise last
