"""workloads.transfer against a real local HTTP server and real file:// paths."""

from __future__ import annotations

import hashlib
import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from workloads import transfer


class _Handler(http.server.BaseHTTPRequestHandler):
    """Serves ``root`` for GET, stores PUT bodies, and fails the first N requests with 503."""

    root: Path
    fail_first: dict[str, int]
    puts: dict[str, bytes]

    def log_message(self, *args: object) -> None:  # keep test output clean
        pass

    def _flaky(self) -> bool:
        left = self.fail_first.get(self.path, 0)
        if left:
            self.fail_first[self.path] = left - 1
            self.send_error(503, "try again")
            return True
        return False

    def do_GET(self) -> None:
        if self._flaky():
            return
        path = self.root / self.path.lstrip("/")
        if not path.is_file():
            self.send_error(404)
            return
        data = path.read_bytes()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self) -> None:
        if self._flaky():
            return
        length = int(self.headers["Content-Length"])
        self.puts[self.path] = self.rfile.read(length)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, type[_Handler]]]:
    root = tmp_path / "served"
    root.mkdir()
    handler = type("H", (_Handler,), {"root": root, "fail_first": {}, "puts": {}})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transfer, "BACKOFF_S", 0.01)


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def write_manifest(path: Path, entries: list[dict]) -> str:
    path.write_text(json.dumps(entries))
    return str(path)


def test_get_http_retries_and_verifies(tmp_path: Path, server: tuple[str, type[_Handler]]) -> None:
    url, handler = server
    (handler.root / "a.bin").write_bytes(b"alpha" * 1000)
    (handler.root / "b.bin").write_bytes(b"beta")
    handler.fail_first["/a.bin"] = 2  # two 503s, then success
    manifest = write_manifest(tmp_path / "m.json", [
        {"url": f"{url}/a.bin", "path": "x/a.bin", "md5": md5(b"alpha" * 1000)},
        {"url": f"{url}/b.bin", "path": "b.bin", "md5": md5(b"beta")},
    ])
    dest = tmp_path / "dest"
    assert transfer.main(["get", manifest, str(dest)]) == 0
    assert (dest / "x/a.bin").read_bytes() == b"alpha" * 1000
    assert (dest / "b.bin").read_bytes() == b"beta"
    assert handler.fail_first["/a.bin"] == 0


def test_get_md5_mismatch_and_404_fail(tmp_path: Path, server: tuple[str, type[_Handler]],
                                        capsys: pytest.CaptureFixture[str]) -> None:
    url, handler = server
    (handler.root / "a.bin").write_bytes(b"alpha")
    manifest = write_manifest(tmp_path / "m.json", [
        {"url": f"{url}/a.bin", "path": "a.bin", "md5": md5(b"other")},
        {"url": f"{url}/missing", "path": "m.bin", "md5": None},
    ])
    assert transfer.main(["get", manifest, str(tmp_path / "d")]) == 1
    err = capsys.readouterr().err
    assert "md5 mismatch" in err and "HTTP 404" in err
    assert not (tmp_path / "d" / "a.bin").exists()  # nothing half-right left behind
    assert not list((tmp_path / "d").glob(".*.part"))


def test_get_file_url_hardlinks_and_skips_present(tmp_path: Path) -> None:
    src = tmp_path / "bucket" / "f.parquet"
    src.parent.mkdir()
    src.write_bytes(b"frame")
    manifest = write_manifest(tmp_path / "m.json",
                              [{"url": src.as_uri(), "path": "f.parquet", "md5": md5(b"frame")}])
    dest = tmp_path / "host"
    assert transfer.main(["get", manifest, str(dest)]) == 0
    assert (dest / "f.parquet").stat().st_ino == src.stat().st_ino  # hardlink, no copy
    src.unlink()  # already present with the right md5: not fetched again
    assert transfer.main(["get", manifest, str(dest)]) == 0


def test_get_rejects_paths_escaping_dest(tmp_path: Path) -> None:
    src = tmp_path / "f"
    src.write_bytes(b"x")
    manifest = write_manifest(tmp_path / "m.json",
                              [{"url": src.as_uri(), "path": "../../evil", "md5": None}])
    assert transfer.main(["get", manifest, str(tmp_path / "d")]) == 1
    assert not (tmp_path.parent / "evil").exists()


def test_put_http_and_file(tmp_path: Path, server: tuple[str, type[_Handler]]) -> None:
    url, handler = server
    handler.fail_first["/res/summary.json"] = 1
    summary = tmp_path / "summary.json"
    summary.write_text('{"status": "ok"}')
    target = tmp_path / "bucket" / "results" / "summary.json"
    manifest = write_manifest(tmp_path / "m.json", [
        {"path": str(summary), "url": f"{url}/res/summary.json"},
        {"path": str(summary), "url": target.as_uri()},
        {"path": str(tmp_path / "absent.parquet"), "url": f"{url}/x", "optional": True},
    ])
    assert transfer.main(["put", manifest]) == 0
    assert handler.puts["/res/summary.json"] == b'{"status": "ok"}'
    assert target.read_text() == '{"status": "ok"}'
    assert "/x" not in handler.puts


def test_a_file_put_links_the_result_into_the_bucket(tmp_path: Path) -> None:
    """A result is written once (by rename): the bucket's object can be the same inode,
    with no byte copied, and a second put of the same file is just as complete."""
    summary = tmp_path / "trial" / "summary.json"
    summary.parent.mkdir()
    summary.write_text('{"status": "ok"}')
    target = tmp_path / "bucket" / "results" / "summary.json"
    manifest = write_manifest(tmp_path / "m.json", [{"path": str(summary),
                                                      "url": target.as_uri()}])
    for _ in range(2):
        assert transfer.main(["put", manifest]) == 0
        assert target.stat().st_ino == summary.stat().st_ino
        assert target.read_text() == '{"status": "ok"}'
    assert not list(target.parent.glob(".*"))


def test_a_file_put_links_what_its_writer_synced_without_a_sync_of_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner's own results were synced as it wrote them: their put only links them
    (a sync there costs a journal commit); any other file is still synced."""
    import os

    trial = tmp_path / "trial"
    trial.mkdir()
    ours, theirs = trial / "summary.json", trial / "output.log"
    ours.write_text('{"status": "ok"}')
    theirs.write_text("a job's line\n")
    bucket = tmp_path / "bucket"
    entries = [{"path": str(f), "url": (bucket / f.name).as_uri()} for f in (ours, theirs)]
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real(fd))
    assert transfer.put_all(entries, frozenset({os.path.realpath(ours)})) == []
    assert len(synced) == 1  # output.log's, not summary.json's
    for f in (ours, theirs):
        assert (bucket / f.name).stat().st_ino == f.stat().st_ino
    assert not list(bucket.glob(".*"))


def test_a_runners_put_syncs_only_what_it_wrote_and_links_it_into_the_bucket(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``workloads.run --put``: two syncs (its time series and summary, as written), none for
    the put; the bucket holds the same inodes, summary.json last."""
    import os

    from workloads import protocol, run

    out, bucket = tmp_path / "out", tmp_path / "bucket"
    names = (protocol.TIMESERIES_FILE, protocol.SUMMARY_FILE)
    manifest = write_manifest(tmp_path / "put.json", [
        {"path": str(out / n), "url": (bucket / n).as_uri(), "optional": True} for n in names])
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real(fd))
    code = run.main(["--workload", "sleep", "--duration", "0.1", "--sample-hz", "0",
                     "--quiet", "--out", str(out), "--put", manifest])
    assert code == protocol.EXIT_OK
    assert len(synced) == 2
    for n in names:
        assert (bucket / n).stat().st_ino == (out / n).stat().st_ino


def test_put_missing_required_file_fails(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path / "m.json",
                              [{"path": str(tmp_path / "nope"), "url": (tmp_path / "o").as_uri()}])
    assert transfer.main(["put", manifest]) == 1


def test_command_line_usage_and_bad_manifest(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    run = [sys.executable, "-m", "workloads.transfer"]
    assert subprocess.run([*run, "frobnicate"], capture_output=True).returncode == 2
    proc = subprocess.run([*run, "put", str(bad)], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.startswith("error: cannot read manifest")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_a_hard_linked_get_reads_no_byte_to_verify(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A file:// get that hard-links shares the bucket's inode: nothing was transferred,
    so nothing is hashed (it hashed 763 MiB of inputs per sweep), also when run again."""
    src = tmp_path / "bucket" / "f.parquet"
    src.parent.mkdir()
    src.write_bytes(b"frame")
    hashed: list[Path] = []
    real = transfer.md5_of
    monkeypatch.setattr(transfer, "md5_of", lambda p: hashed.append(p) or real(p))
    manifest = write_manifest(tmp_path / "m.json",
                              [{"url": src.as_uri(), "path": "f.parquet", "md5": md5(b"frame")}])
    dest = tmp_path / "host"
    assert transfer.main(["get", manifest, str(dest)]) == 0
    assert transfer.main(["get", manifest, str(dest)]) == 0
    assert (dest / "f.parquet").stat().st_ino == src.stat().st_ino and hashed == []


def test_a_file_get_replaces_a_stale_copy_by_the_buckets_file_and_leaves_no_temporary(
        tmp_path: Path) -> None:
    src = tmp_path / "bucket" / "f.parquet"
    src.parent.mkdir()
    src.write_bytes(b"new frame")
    dest = tmp_path / "host"
    dest.mkdir()
    (dest / "f.parquet").write_bytes(b"old frame")  # an earlier sweep's, other bytes
    manifest = write_manifest(tmp_path / "m.json", [
        {"url": src.as_uri(), "path": "f.parquet", "md5": md5(b"new frame")}])
    assert transfer.main(["get", manifest, str(dest)]) == 0
    assert (dest / "f.parquet").stat().st_ino == src.stat().st_ino
    assert sorted(p.name for p in dest.iterdir()) == ["f.parquet"]
