"""The ``workloads`` wheel that ships to the hosts, built from this process's package."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import io
import re
import tempfile
import threading
import zipfile
from pathlib import Path

WHEEL_DIST = "cloudprof_workloads"  # the wheel's distribution name (not "cloudprof": no clash)
WHEEL_DEPS = ("numpy", "pyarrow", "psutil")  # the data plane's only run-time dependencies


# --------------------------------------------------------------------------- the wheel


_wheel_lock = threading.Lock()
_wheel_built: dict[str, tuple[str, bytes, str]] = {}  # source dir -> (file name, bytes, hash)


def workloads_wheel(out_dir: Path) -> tuple[Path, str]:
    """The wheel of this process's ``workloads`` package, built once per process.

    Every machine of a sweep gets the very same wheel, even if the checkout is
    edited while the sweep runs.
    """
    source = _workloads_dir()
    with _wheel_lock:
        if str(source) not in _wheel_built:
            with tempfile.TemporaryDirectory(prefix="cloudprof-wheel-") as tmp:
                path, digest = build_workloads_wheel(Path(tmp), source)
                _wheel_built[str(source)] = (path.name, path.read_bytes(), digest)
        name, data, digest = _wheel_built[str(source)]
    path = Path(out_dir) / name
    path.write_bytes(data)
    return path, digest


def _workloads_dir() -> Path:
    import workloads

    return Path(workloads.__file__).resolve().parent


def _package_files(root: Path) -> list[tuple[str, bytes]]:
    """(archive name, content) of every file of the package, sorted, without caches."""
    files = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root.parent).as_posix()
        if path.is_dir() or "__pycache__" in path.parts or path.suffix in (".pyc", ".pyo"):
            continue
        files.append((rel, path.read_bytes()))
    return files


def requirements() -> list[str]:
    """numpy/pyarrow/psutil with the bounds pyproject gives them (one source of truth)."""
    try:
        reqs = importlib.metadata.requires("cloudprof") or []
    except importlib.metadata.PackageNotFoundError:
        reqs = []
    out = []
    for dep in WHEEL_DEPS:
        found = [r.split(";")[0].strip() for r in reqs if re.match(rf"^{dep}\b", r)]
        out.append(found[0] if found else dep)
    return out


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"sha256={digest.decode()}"


def build_workloads_wheel(out_dir: Path, source: Path | None = None) -> tuple[Path, str]:
    """A wheel holding only the ``workloads`` package; returns (path, content hash).

    The hash covers the package files and the requirements, so any change to
    what runs on the VM gives a new venv there, and an unchanged checkout reuses
    the old one. The zip is deterministic (fixed timestamps, sorted entries).
    """
    import workloads

    files = _package_files(source or _workloads_dir())
    requires = requirements()
    h = hashlib.sha256()
    for name, data in files:
        h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    h.update("\n".join(requires).encode())
    digest = h.hexdigest()[:16]
    version = f"{workloads.__version__}+h{digest}"
    dist_info = f"{WHEEL_DIST}-{version}.dist-info"
    metadata = "\n".join(
        [
            "Metadata-Version: 2.1",
            "Name: cloudprof-workloads",
            f"Version: {version}",
            "Summary: cloudprof's data plane (trial runner, workloads, profiling agent)",
            "Requires-Python: >=3.10",
            *(f"Requires-Dist: {r}" for r in requires),
            "",
        ]
    ).encode()
    wheel_meta = (
        b"Wheel-Version: 1.0\nGenerator: cloudprof\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    entries = [
        *files,
        (f"{dist_info}/METADATA", metadata),
        (f"{dist_info}/WHEEL", wheel_meta),
        (f"{dist_info}/top_level.txt", b"workloads\n"),
    ]
    record = io.StringIO()
    for name, data in entries:
        record.write(f"{name},{_record_hash(data)},{len(data)}\n")
    record.write(f"{dist_info}/RECORD,,\n")
    entries.append((f"{dist_info}/RECORD", record.getvalue().encode()))
    path = Path(out_dir) / f"{WHEEL_DIST}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return path, digest
