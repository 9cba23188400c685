"""Moves files between a host and the sweep's bucket through pre-signed URLs (stdlib only).

Runs on the VM, so it needs no cloud SDK and holds no credential: the
orchestrator signs one URL per object and ships a manifest.

    python -m workloads.transfer get MANIFEST.json DEST_DIR
        MANIFEST: [{"url": ..., "path": "relative/file", "md5": "hex"|null}, ...]
        Downloads in parallel, verifies the md5 of what it transferred (a file://
        hard link shares the bucket's inode: nothing was transferred, nothing to
        verify), retries with backoff; files already present (the bucket's own
        inode, or the right md5) are kept (a retried trial re-runs this cheaply).
    python -m workloads.transfer put MANIFEST.json
        MANIFEST: [{"path": "/local/file", "url": ..., "headers": {...}?,
                    "optional": true?}, ...]  (optional: skip the file when absent)
        Uploads each file with HTTP PUT, or hard-links it for file:// URLs (a copy
        across filesystems) — how a VM puts its results in the bucket, where a
        dropped session cannot lose them. A put file is never rewritten in place
        afterwards (results are written once, by rename), so a link can stand for a copy.

URLs may be http(s):// or file://; a file:// GET hardlinks when it can (the
local provider shares one inode between its bucket and each host). Exit code 0
when every file made it, 1 otherwise with one ``error:`` line per failure.

The trial runner puts its own results with ``put_all`` (``python -m workloads.run
--put MANIFEST``), in the process that wrote them: a process start saved per trial.
So this module imports only what a file:// put needs; the HTTP client (urllib.request
pulls in http.client, email and ssl: ~60 ms), hashlib and the thread pool load when
an entry needs them.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote, urlparse

from workloads.atomic import atomic_path, link_into_place, link_or_copy

ATTEMPTS = 4
BACKOFF_S = 0.5  # doubled after each failed attempt
TIMEOUT_S = 60.0
CHUNK = 1 << 20
PARALLEL = 8

T = TypeVar("T")


class TransferError(Exception):
    """One file could not be moved; the message is one line."""


class _ClientError(TransferError):
    """The server refused the request (a 4xx other than 408/429): retrying cannot help."""


def md5_of(path: Path) -> str:
    import hashlib

    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as fh:
        while block := fh.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _file_path(url: str) -> Path:
    return Path(unquote(urlparse(url).path))


def _urlopen(request: Any) -> Any:
    """``urllib.request.urlopen`` (imported on the first HTTP transfer), with a client
    error (4xx but 408 and 429) raised as ``_ClientError``, which is never retried."""
    import urllib.error
    import urllib.request

    try:
        return urllib.request.urlopen(request, timeout=TIMEOUT_S)
    except urllib.error.HTTPError as exc:
        if 400 <= exc.code < 500 and exc.code not in (408, 429):
            raise _ClientError(f"HTTP {exc.code} {exc.reason}") from exc
        raise


def _retry(action: Callable[[], T], what: str, attempts: int = ATTEMPTS) -> T:
    """Retry transient failures with exponential backoff; client errors (4xx) fail at once."""
    delay = BACKOFF_S
    for attempt in range(1, attempts + 1):
        try:
            return action()
        except _ClientError as exc:
            raise TransferError(f"{what}: {exc}") from exc
        except (OSError, TransferError) as exc:  # HTTP 5xx, URLError, timeouts, md5 mismatch
            last: Exception = exc
        if attempt < attempts:
            time.sleep(delay)
            delay *= 2
    reason = " ".join(str(last).split()) or type(last).__name__
    raise TransferError(f"{what}: {reason} (after {attempts} attempts)")


def _local_dest(dest_dir: Path, rel: str) -> Path:
    dest = (dest_dir / rel).resolve()
    if dest_dir.resolve() not in dest.parents:
        raise TransferError(f"manifest path {rel!r} escapes {dest_dir}")
    return dest


def get_one(entry: dict[str, Any], dest_dir: Path) -> Path:
    """Download one manifest entry to ``dest_dir/entry['path']`` unless already there."""
    url, expected = entry["url"], entry.get("md5")
    dest = _local_dest(dest_dir, entry["path"])
    src = _file_path(url) if url.startswith("file://") else None
    if src is not None and dest.is_file() and _same_file(src, dest):
        return dest  # linked by an earlier get: the very bytes the bucket holds
    if expected and dest.is_file() and md5_of(dest) == expected:
        return dest

    if src is not None and link_into_place(src, dest):
        return dest  # nothing was transferred: the bucket's own file, not a copy

    def attempt() -> Path:
        with atomic_path(dest, mode=None) as tmp:
            if src is not None:  # on another filesystem than the bucket
                shutil.copyfile(src, tmp)
            else:
                with _urlopen(url) as resp, open(tmp, "wb") as out:
                    shutil.copyfileobj(resp, out, CHUNK)
            if expected and (got := md5_of(tmp)) != expected:
                raise TransferError(f"md5 mismatch (expected {expected}, got {got})")
        return dest

    return _retry(attempt, f"get {entry['path']}")


def put_one(entry: dict[str, Any], synced: frozenset[str] = frozenset()) -> str:
    """Upload one file to a pre-signed PUT URL, or copy it to a file:// destination.

    ``synced``: the real paths of files their writer has already synced (the runner's own
    results, written through ``atomic_path``): a file:// put links them into place without
    a sync of its own, which for a link writes no byte but costs a journal commit; any
    other file is synced before its rename, as before."""
    src, url = Path(entry["path"]), entry["url"]
    if not src.is_file():
        if entry.get("optional"):
            return ""
        raise TransferError(f"put {src}: no such file")

    def attempt() -> str:
        if url.startswith("file://"):  # a result file, written once: linked, not copied
            dest = _file_path(url)
            if synced and os.path.realpath(src) in synced and link_into_place(src, dest):
                return url
            with atomic_path(dest, mode=None) as tmp:
                link_or_copy(src, tmp)
            return url
        headers = {"Content-Type": "application/octet-stream", **entry.get("headers", {})}
        headers["Content-Length"] = str(src.stat().st_size)
        import urllib.request

        with open(src, "rb") as body:
            req = urllib.request.Request(url, data=body, method="PUT", headers=headers)
            with _urlopen(req) as resp:
                resp.read()
        return url

    return _retry(attempt, f"put {src.name}")


def run_all(func: Callable[[dict[str, Any]], object], entries: list[dict[str, Any]],
            parallel: bool = True) -> list[str]:
    """``func`` over every entry (in a thread pool when ``parallel`` and there is more than
    one); the one-line error of each entry that failed."""

    def guarded(entry: dict[str, Any]) -> str | None:
        try:
            func(entry)
        except (TransferError, OSError, KeyError) as exc:
            return " ".join(str(exc).split()) or type(exc).__name__
        return None

    if parallel and len(entries) > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=PARALLEL) as pool:
            errors = list(pool.map(guarded, entries))
    else:
        errors = [guarded(entry) for entry in entries]
    return [e for e in errors if e is not None]


def put_all(entries: list[dict[str, Any]], synced: frozenset[str] = frozenset()) -> list[str]:
    """Upload every entry of a put manifest (see ``put_one``, and its ``synced``); the
    one-line errors.

    HTTP uploads run in parallel; file:// ones (a trial's few result files copied on
    this disk) one by one, without starting a thread pool for them.
    """
    remote = [e for e in entries if not str(e.get("url", "")).startswith("file://")]
    return run_all(lambda e: put_one(e, synced), entries, parallel=bool(remote))


def get_all(entries: list[dict[str, Any]], dest_dir: Path) -> list[str]:
    """Download every entry of a get manifest into ``dest_dir`` (see ``get_one``); the
    one-line errors.

    In parallel, unless every entry is a file:// URL on ``dest_dir``'s filesystem: those
    are hard links (microseconds each), which a thread pool only slows down (~0.09 s of
    locks and thread start-ups for a dry run's 100 input files)."""
    return run_all(lambda e: get_one(e, dest_dir), entries,
                   parallel=not all(_linkable(e, dest_dir) for e in entries))


def _linkable(entry: dict[str, Any], dest_dir: Path) -> bool:
    url = str(entry.get("url", ""))
    if not url.startswith("file://"):
        return False
    try:
        return _file_path(url).stat().st_dev == dest_dir.stat().st_dev
    except OSError:
        return False


def _report(errors: list[str]) -> int:
    for error in errors:
        print(f"error: {error}", file=sys.stderr, flush=True)
    return 1 if errors else 0


def load_manifest(path: str | Path) -> list[dict[str, Any]]:
    """A manifest's entries (a JSON list, or an object with them under "files")."""
    data = json.loads(Path(path).read_text())
    entries = data["files"] if isinstance(data, dict) else data
    if not isinstance(entries, list):
        raise ValueError("manifest must be a JSON list of entries")
    return entries


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    usage = "usage: python -m workloads.transfer get MANIFEST DEST_DIR | put MANIFEST"
    if not args or args[0] not in ("get", "put") or len(args) != (3 if args[0] == "get" else 2):
        print(usage, file=sys.stderr)
        return 2
    try:
        entries = load_manifest(args[1])
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: cannot read manifest {args[1]}: {exc}", file=sys.stderr)
        return 2
    if args[0] == "get":
        dest_dir = Path(args[2])
        dest_dir.mkdir(parents=True, exist_ok=True)
        return _report(get_all(entries, dest_dir))
    return _report(put_all(entries))


if __name__ == "__main__":
    raise SystemExit(main())
