"""One atomic-write helper per package: readers see the old file or the new one, never half."""

from __future__ import annotations

import ast
import stat
from pathlib import Path

import pytest

from orchestrator import atomic as control
from workloads import atomic as data

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("helper", [control, data], ids=["orchestrator", "workloads"])
def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(
    helper: object, tmp_path: Path
) -> None:
    target = tmp_path / "sub" / "sweep.json"
    helper.atomic_write_text(target, "old")  # type: ignore[attr-defined]
    assert target.read_text() == "old" and stat.S_IMODE(target.stat().st_mode) == 0o644
    with pytest.raises(RuntimeError), helper.atomic_path(target) as tmp:  # type: ignore[attr-defined]
        tmp.write_text("half")
        raise RuntimeError("crash mid-write")
    assert target.read_text() == "old"
    assert sorted(p.name for p in target.parent.iterdir()) == ["sweep.json"]


def test_a_secret_is_never_readable_by_others(tmp_path: Path) -> None:
    key = tmp_path / "keys" / "id_ed25519"
    control.atomic_write_bytes(key, b"secret", mode=0o600)
    assert key.read_bytes() == b"secret" and stat.S_IMODE(key.stat().st_mode) == 0o600


def test_a_hard_link_keeps_its_source_mode(tmp_path: Path) -> None:
    src = tmp_path / "frame.parquet"
    src.write_bytes(b"x")
    src.chmod(0o640)
    dest = tmp_path / "bucket" / "frame.parquet"
    with data.atomic_path(dest, mode=None) as tmp:
        tmp.unlink()
        tmp.hardlink_to(src)
    assert dest.stat().st_ino == src.stat().st_ino
    assert stat.S_IMODE(src.stat().st_mode) == 0o640


def _renames(path: Path) -> list[int]:
    """Lines of ``path`` that rename a file (``os.replace``/``os.rename``, ``Path.replace``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name, owner = node.func.attr, node.func.value
            if name in ("replace", "rename") and (
                (isinstance(owner, ast.Name) and owner.id == "os")
                or (name == "replace" and len(node.args) == 1 and not node.keywords
                    and not isinstance(owner, ast.Constant))
            ):
                lines.append(node.lineno)
    return lines


def test_only_the_helpers_rename_files_into_place() -> None:
    allowed = {REPO / "orchestrator" / "atomic.py", REPO / "workloads" / "atomic.py",
               # runs inside a user's --command Python, which may not import cloudprof at all
               REPO / "workloads" / "profilers" / "hook" / "sitecustomize.py",
               REPO / "workloads" / "profilers" / "hook" / "cloudprof_heap.py"}
    found = {}
    for package in ("orchestrator", "workloads"):
        for path in sorted((REPO / package).rglob("*.py")):
            if path not in allowed and (lines := _renames(path)):
                found[str(path.relative_to(REPO))] = lines
    assert found == {}


def test_link_or_copy_links_on_one_filesystem_and_copies_across(tmp_path: Path) -> None:
    src = tmp_path / "timeseries.parquet"
    src.write_bytes(b"rows")
    with data.atomic_path(tmp_path / "bucket" / "ts.parquet", mode=None) as tmp:
        assert data.link_or_copy(src, tmp)
    assert (tmp_path / "bucket" / "ts.parquet").stat().st_ino == src.stat().st_ino
    other = Path("/dev/shm")
    if not other.is_dir() or other.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("no second filesystem to copy across")
    elsewhere = other / f"cloudprof-test-{tmp_path.name}"
    try:
        elsewhere.write_bytes(b"more rows")
        with data.atomic_path(tmp_path / "copied.parquet") as tmp:
            assert not data.link_or_copy(elsewhere, tmp)
        assert (tmp_path / "copied.parquet").read_bytes() == b"more rows"
        assert not list(tmp_path.glob(".*.tmp"))
    finally:
        elsewhere.unlink(missing_ok=True)
