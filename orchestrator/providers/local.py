"""The embedded provider: "machines" are work directories on this host, a "bucket" a directory.

``--dry-run`` and ``--provider local`` run the real pipeline through these
classes — staging through a bucket, fetching inputs with ``workloads.transfer``,
running ``python -m workloads.run`` in a separate process (or forked by the
host's warm runner, which this process asks itself: ``LocalExecutor._run_forked``),
collecting its files — so what is tested locally is the path a cloud VM takes,
minus the network.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import unquote, urlparse

from orchestrator import settings
from orchestrator.atomic import atomic_path, atomic_write_bytes, atomic_write_text
from orchestrator.errors import BucketError, ProviderError
from orchestrator.providers.base import (
    Bucket,
    CommandResult,
    Executor,
    Instance,
    Provider,
    ProviderOptions,
    VmRequest,
    file_md5,
)
from workloads import warm_client

# The directory holding the ``workloads`` package of this checkout/installation:
# local "hosts" import the very code the orchestrator ships to VMs.
_WORKLOADS_ROOT = str(Path(__import__("workloads").__file__).resolve().parent.parent)
_TAIL_LINES = 20


def host_facts() -> dict[str, object]:
    """What a trial on this host ran on (shown next to the planned machine)."""
    import platform

    import psutil

    return {
        "vcpus": os.cpu_count() or 1,
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 2),
        "hostname": platform.node(),
    }


class LocalExecutor(Executor):
    """Runs argv in a subprocess (never a shell) inside the host's work directory."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = str(workdir)
        self.python = sys.executable
        self._procs: set[_Command] = set()
        self._lock = threading.Lock()
        self._closed = False

    @property
    def cache_dir(self) -> str:
        """cloudprof's cache (``$CLOUDPROF_CACHE``, else ``~/.cache/cloudprof``), not the run's
        host directory: a dry run's --setup is reused by the next one, and run directories
        hold results, not environments."""
        return str(settings.cache_root() / "host")

    def _path(self, remote: str) -> Path:
        path = Path(remote)
        return path if path.is_absolute() else Path(self.workdir) / path

    def run(
        self,
        argv: Sequence[str],
        *,
        on_line: Callable[[str], None] | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (_WORKLOADS_ROOT, env.get("PYTHONPATH")) if p
        )
        env["PYTHONUNBUFFERED"] = "1"
        client = warm_client.client_args(list(argv))
        if client is not None and client[0] == "stop":  # what the client process would do
            with self._lock:
                if self._closed:
                    raise ProviderError("local host closed (the sweep is stopping)")
            return CommandResult(exit_code=warm_client.stop(client[1]))
        if client is not None:
            result = self._run_forked(client[1], client[3:], env, on_line, timeout)
            if result is not None:
                return result
            # no server took it: a fresh runner, as the client process would have started
            argv = [self.python, "-m", "workloads.run", *client[3:]]
        with self._lock:
            if self._closed:
                raise ProviderError("local host closed (the sweep is stopping)")
            # Own session: a Ctrl-C in the terminal reaches the orchestrator only,
            # which then stops its children itself, in order.
            proc = subprocess.Popen(
                list(argv), cwd=self.workdir, env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                start_new_session=True,
            )
            handle = _Spawned(proc)
            self._procs.add(handle)
        assert proc.stdout is not None
        return self._follow(handle, proc.stdout, on_line, timeout)

    def _run_forked(self, name: str, runner_args: list[str], env: dict[str, str],
                    on_line: Callable[[str], None] | None,
                    timeout: float | None) -> CommandResult | None:  # fmt: skip
        """A warm runner's trial (``WarmRunner.argv``) without the client process: this
        process sends the client's request and follows the trial as the client would
        (``workloads.warm_client.Trial``): no interpreter start per trial
        (``benchmarks/bench_trial_cycle.py``, "around the runner").
        The trial's stdout and stderr are one pipe read here, as a client's were; None when
        no server takes the request (the caller starts a fresh runner)."""
        with self._lock:
            if self._closed:
                raise ProviderError("local host closed (the sweep is stopping)")
        out_r, out_w = os.pipe()
        stdin = os.open(os.devnull, os.O_RDONLY)
        try:
            trial = warm_client.Trial.request(name, runner_args, os.path.realpath(self.workdir),
                                              env, [stdin, out_w, out_w])  # fmt: skip
        finally:
            os.close(stdin)
            os.close(out_w)  # the trial's (and its sampler's) copies are the pipe's writers now
        if trial is None or not trial.started():
            os.close(out_r)
            return None
        handle = _Forked(trial)
        with self._lock:
            self._procs.add(handle)
            closed = self._closed
        if closed:  # closed while the trial was forked: it stops like any other command
            # (from a thread: its output must be read meanwhile, or a full pipe blocks it)
            threading.Thread(target=handle.stop, name="cloudprof-stop", daemon=True).start()
        with open(out_r, encoding=None, errors=None) as stream:  # text, as Popen's
            return self._follow(handle, stream, on_line, timeout)

    def _follow(self, handle: _Command, stream: Any, on_line: Callable[[str], None] | None,
                timeout: float | None) -> CommandResult:  # fmt: skip
        """Stream a command's output, a line at a time, until its end (or ``timeout``)."""
        timer = threading.Timer(timeout, handle.stop) if timeout else None
        if timer:
            timer.daemon = True
            timer.start()
        tail: list[str] = []
        try:
            for raw in stream:
                line = raw.rstrip("\n")
                tail.append(line)
                del tail[:-_TAIL_LINES]
                if on_line is not None:
                    on_line(line)
            code = handle.wait()
            if code is None:  # a forked trial whose warm runner died under it
                tail.append(warm_client.LOST)
                del tail[:-_TAIL_LINES]
                if on_line is not None:
                    on_line(warm_client.LOST)
                code = 1
        finally:
            if timer:
                timer.cancel()
            if not handle.done():
                handle.stop()
            with self._lock:
                self._procs.discard(handle)
        text = "\n".join(tail)
        return CommandResult(exit_code=code, stdout_tail=text, stderr_tail=text)

    def put(self, local: Path, remote: str) -> None:
        dest = self._path(remote)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(local, dest)

    def get(self, remote: str, local: Path) -> None:
        src = self._path(remote)
        if not src.is_file():
            raise FileNotFoundError(str(src))
        Path(local).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, local)

    def close(self) -> None:
        """Stop every command still running: the sweep is stopping or this host is done."""
        with self._lock:
            self._closed = True
            procs = list(self._procs)
        for proc in procs:
            proc.stop()


class _Command:
    """A running command as ``LocalExecutor`` follows it: a process, or a forked trial."""

    def wait(self) -> int | None:
        """Its exit code (a signal's as ``-N``, like ``Popen``); None: it was lost."""
        raise NotImplementedError

    def done(self) -> bool:
        raise NotImplementedError

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGINT first (the runner writes an "interrupted" summary), then SIGKILL."""
        raise NotImplementedError


class _Spawned(_Command):
    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc

    def wait(self) -> int | None:
        return self.proc.wait()

    def done(self) -> bool:
        return self.proc.poll() is not None

    def stop(self, grace_s: float = 5.0) -> None:
        _stop(self.proc, grace_s)


class _Forked(_Command):
    """A trial a warm runner forked: signalled through its process group, as the client
    process forwarded signals; its end is the server's reply, awaited by a thread of its
    own, so that a server that dies under the trial is noticed (and the trial killed)
    while the trial's output is still open."""

    def __init__(self, trial: warm_client.Trial) -> None:
        self.trial = trial
        self.ended = threading.Event()
        self.result: tuple[str, int] = ("lost", 1)

        def await_end() -> None:
            try:
                self.result = trial.outcome()
            finally:
                self.ended.set()

        threading.Thread(target=await_end, name="cloudprof-forked-trial", daemon=True).start()

    def wait(self) -> int | None:
        self.ended.wait()
        how, value = self.result
        return value if how == "exit" else -value if how == "signal" else None

    def done(self) -> bool:
        return self.ended.is_set()

    def stop(self, grace_s: float = 5.0) -> None:
        if self.ended.is_set():
            return  # reaped: its process group's number may be another's now
        self.trial.signal(signal.SIGINT)
        if not self.ended.wait(grace_s):
            self.trial.signal(signal.SIGKILL)
            self.ended.wait()


def _stop(proc: subprocess.Popen[str], grace_s: float = 5.0) -> None:
    """SIGINT first (the runner writes an "interrupted" summary), then SIGKILL."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(grace_s)
    except (ProcessLookupError, PermissionError):
        return
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        proc.wait()


class LocalProvider(Provider):
    """Hosts are work directories below ``options.workdir`` (the run's ``hosts/``)."""

    name: ClassVar[str] = "local"
    creates_machines: ClassVar[bool] = False
    # All "machines" share this host's cores: running them at once would make
    # each one's measurements wrong, so the engine runs them one after another.
    concurrent_machines: ClassVar[bool] = False

    def __init__(self, options: ProviderOptions | None = None) -> None:
        self.options = options or ProviderOptions()
        self.root = Path(self.options.workdir or Path.cwd() / "cloudprof-local-hosts")

    def check_credentials(self) -> None:
        """Nothing to check: the local provider uses no cloud."""

    def create(self, req: VmRequest) -> Instance:
        workdir = self.root / req.name
        workdir.mkdir(parents=True, exist_ok=True)
        return Instance(provider=self.name, id=req.name, name=req.name, machine=req.machine,
                        zone=None, state="running", address=str(workdir),
                        labels=dict(req.labels), facts=host_facts())

    def wait_ready(self, inst: Instance, timeout: float = 600) -> Instance:
        if not inst.address or not Path(inst.address).is_dir():
            raise ProviderError(f"local host {inst.name} has no work directory")
        return inst

    def connect(self, inst: Instance) -> Executor:
        return LocalExecutor(Path(inst.address or self.root / inst.name))

    def delete(self, inst: Instance) -> None:
        """Nothing to release: the work directory stays with the run for inspection."""

    def list(self, labels: dict[str, str]) -> list[Instance]:
        return []


MD5_CACHE = ".md5-cache.json"
"""In the bucket's root: ``{path: [size, mtime_ns, md5]}`` of the large files it has hashed."""
MD5_CACHE_MIN_BYTES = 1 << 20  # smaller files hash faster than a cache look-up is worth


def default_bucket_dir() -> Path:
    """The local bucket when none is given: a cache shared by every local sweep."""
    return settings.cache_root() / "bucket"


class LocalBucket(Bucket):
    """A directory standing in for object storage; keys are relative paths."""

    def __init__(self, url: str | Path | None = None) -> None:
        if url is None:
            root = default_bucket_dir()
        else:
            text = str(url)
            root = Path(unquote(urlparse(text).path)) if text.startswith("file://") \
                else Path(text)
        self.root = root.expanduser().resolve()
        self.url = str(self.root)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BucketError(f"cannot use {self.root} as a bucket: {exc.strerror}") from exc
        # path -> (size, mtime_ns, md5). Kept on disk (MD5_CACHE) so that a sweep does
        # not hash hundreds of MiB of unchanged inputs again (~1.5 s at the article's
        # size): a digest is trusted while the file's size and mtime are the ones it
        # was computed for. Inputs are written once and never modified in place.
        self._md5: dict[str, tuple[int, int, str]] | None = None
        self._md5_dirty = False
        self._md5_lock = threading.Lock()

    def _key_path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if path != self.root and self.root not in path.parents:
            raise BucketError(f"object key {key!r} escapes the bucket")
        return path

    def md5(self, path: Path) -> str:
        """The file's MD5, from the cache while its size and mtime are unchanged."""
        st = path.stat()
        key = str(path)
        with self._md5_lock:
            known = self._md5_cache().get(key)
        if known is not None and known[:2] == (st.st_size, st.st_mtime_ns):
            return known[2]
        digest = file_md5(path)
        if st.st_size >= MD5_CACHE_MIN_BYTES:
            with self._md5_lock:
                self._md5_cache()[key] = (st.st_size, st.st_mtime_ns, digest)
                self._md5_dirty = True
        return digest

    def _md5_cache(self) -> dict[str, tuple[int, int, str]]:
        """Loaded on first use (under the lock); anything unreadable is an empty cache."""
        if self._md5 is None:
            self._md5 = {}
            try:
                data = json.loads((self.root / MD5_CACHE).read_text())
                for key, (size, mtime, digest) in data.items():
                    self._md5[str(key)] = (int(size), int(mtime), str(digest))
            except (OSError, ValueError, TypeError, AttributeError):
                self._md5 = {}
        return self._md5

    def _save_md5(self) -> None:
        """Write the cache back if it grew, without the files that are gone."""
        with self._md5_lock:
            if not self._md5_dirty or self._md5 is None:
                return
            live = {k: list(v) for k, v in self._md5.items() if os.path.exists(k)}
            self._md5_dirty = False
        with contextlib.suppress(OSError):  # only a cache: the next sweep hashes again
            atomic_write_text(self.root / MD5_CACHE, json.dumps(live))

    def _place(self, src: Path, dest: Path) -> None:
        """Hardlink (inputs are immutable, so sharing the inode is safe), else copy; atomic."""
        with atomic_path(dest, mode=None) as tmp:  # a link keeps the source's mode
            tmp.unlink()
            try:
                os.link(src, tmp)
            except OSError:
                shutil.copyfile(src, tmp)

    def _same(self, src: Path, dest: Path) -> bool:
        if not dest.is_file():
            return False
        if os.path.samefile(src, dest):
            return True
        return src.stat().st_size == dest.stat().st_size and self.md5(src) == self.md5(dest)

    def upload_dir(self, local_dir: Path, prefix: str,
                   progress: Callable[[int], None] | None = None) -> list[str]:
        local_dir = Path(local_dir)
        files = sorted(p for p in local_dir.rglob("*") if p.is_file())

        def one(path: Path) -> str | None:
            key = f"{prefix.rstrip('/')}/{path.relative_to(local_dir).as_posix()}"
            dest = self._key_path(key)
            if self._same(path, dest):
                return None
            self._place(path, dest)
            if progress is not None:
                progress(path.stat().st_size)
            return key

        try:
            with ThreadPoolExecutor(max_workers=4) as pool:
                uploaded = [k for k in pool.map(one, files) if k]
        except OSError as exc:  # a full disk, a read-only directory, a directory in the way
            culprit = getattr(exc, "filename2", None) or exc.filename
            where = f" ({culprit})" if culprit else ""
            raise BucketError(f"cannot upload to {self.url}/{prefix}: "
                              f"{exc.strerror or exc}{where}") from None
        self._save_md5()
        return uploaded

    def download_dir(self, prefix: str, local_dir: Path) -> list[Path]:
        out = []
        for key in self.list(prefix):
            dest = Path(local_dir) / key[len(prefix):].lstrip("/")
            self._place(self._key_path(key), dest)
            out.append(dest)
        return out

    def list(self, prefix: str) -> dict[str, str]:
        base = self._key_path(prefix) if prefix else self.root
        start = base if base.is_dir() else base.parent
        out = {}
        for path in sorted(start.rglob("*")):
            if not path.is_file() or path.name.startswith("."):
                continue
            key = path.relative_to(self.root).as_posix()
            if key.startswith(prefix):
                out[key] = self.md5(path)
        self._save_md5()
        return out

    def signed_url(self, key: str, method: str = "GET", expires_s: int = 6 * 3600) -> str:
        """A file:// URL: a local host reads (GET) or writes (PUT) the object's path directly."""
        return self._key_path(key).as_uri()

    def delete_prefix(self, prefix: str) -> int:
        keys = self.list(prefix)
        for key in keys:
            path = self._key_path(key)
            path.unlink(missing_ok=True)
            self._prune(path.parent)
        return len(keys)

    def _prune(self, directory: Path) -> None:
        """Remove directories left empty up to the root, as an object store has none."""
        while directory != self.root and self.root in directory.parents:
            try:
                directory.rmdir()
            except OSError:  # not empty (or gone): stop
                return
            directory = directory.parent

    def put_bytes(self, key: str, data: bytes, metadata: dict[str, str] | None = None) -> None:
        """Written atomically; a directory has no object metadata, so ``metadata`` is unused."""
        atomic_write_bytes(self._key_path(key), data)

    def get_bytes(self, key: str) -> bytes | None:
        try:
            return self._key_path(key).read_bytes()
        except FileNotFoundError:
            return None
