"""Secrets never ship: credential files stay out of the job's archive unless the user asks,
and the host's unpacking refuses links and paths that leave the job's directory, on every
Python (with or without ``tarfile.data_filter``)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from orchestrator import cli
from orchestrator.engine import jobs
from orchestrator.errors import UsageError
from workloads import job

SECRETS = {
    ".env": "API_KEY=sk-live\n",
    ".env.production": "DB_PASSWORD=x\n",
    "deploy/server.pem": "-----BEGIN PRIVATE KEY-----\n",
    "keys/id_ed25519": "-----BEGIN OPENSSH PRIVATE KEY-----\n",
    ".aws/credentials": "[default]\naws_secret_access_key=x\n",
    "home/.config/gcloud/application_default_credentials.json": "{}\n",
    "service_account_credentials.json": "{}\n",
}
CODE = {"train.py": "print('hi')\n", "data/rows.csv": "a,b\n", "environment.yml": "x\n"}


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CLOUDPROF_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "project"
    for rel, text in {**SECRETS, **CODE}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def _shipped(archive: jobs.JobArchive) -> list[str]:
    with tarfile.open(archive.path) as tar:
        return sorted(tar.getnames())


def test_credential_files_are_left_out_with_one_line_naming_them(
    project: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    archive = jobs.pack_workdir(project)
    assert _shipped(archive) == sorted(CODE)
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("warning: --workdir ") and "may hold secrets" in line
    assert "!NAME" in line and ".cloudprofignore" in line
    for shown in (".aws/", ".env", ".env.production", "deploy/server.pem"):
        assert shown in line
    assert "and 2 more" in line  # 7 things left out: five named, the count of the rest


def test_nothing_is_said_when_nothing_was_left_out(
    project: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    (project / ".gitignore").write_text("\n".join(SECRETS) + "\n.aws/\n**/.config/\n")
    for rel in SECRETS:  # ignored by the project itself: not cloudprof's doing
        assert rel.split("/")[0] in (project / ".gitignore").read_text()
    jobs.pack_workdir(project)
    assert "secrets" not in capsys.readouterr().err


def test_cloudprofignore_ships_a_secret_the_user_names_and_gitignore_cannot(
    project: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    (project / ".gitignore").write_text("!*.pem\n")  # a repository's negation: no opt-in
    (project / ".cloudprofignore").write_text("!.env\n")
    shipped = _shipped(jobs.pack_workdir(project))
    assert ".env" in shipped and "deploy/server.pem" not in shipped
    assert ".env.production" not in shipped
    err = capsys.readouterr().err
    assert "deploy/server.pem" in err and ", .env," not in err


def test_a_sweep_plan_says_what_it_left_out_and_creates_nothing(
    project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    code = cli.main(["sweep", "--plan", "--dry-run", "--machine", "n2-highcpu-2",
                     "--workdir", str(project), "--command", "python train.py",
                     "--out", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert code == 0, err
    assert [ln for ln in err.splitlines() if "may hold secrets" in ln]
    assert not (tmp_path / "runs").exists()


# ---------------------------------------------------------------- unpacking on the host


def _archive(path: Path, *members: tuple[tarfile.TarInfo, bytes | None]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _file(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _link(name: str, target: str, kind: bytes) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, None


def _special(name: str, kind: bytes) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    return info, None


HOSTILE = {
    # a symlink out, then a file written through it: the classic escape
    "symlink-then-file": lambda out: [_link("evil", str(out), tarfile.SYMTYPE),
                                      _file("evil/owned")],
    "symlink-alone": lambda out: [_link("evil", "/etc/passwd", tarfile.SYMTYPE)],
    "hardlink": lambda out: [_link("evil", str(out / "owned"), tarfile.LNKTYPE)],
    "dot-dot": lambda out: [_file("../owned")],
    "dot-dot-inside": lambda out: [_file("a/../../owned")],
    "absolute": lambda out: [_file(str(out / "owned"))],
    "fifo": lambda out: [_special("pipe", tarfile.FIFOTYPE)],
    "device": lambda out: [_special("dev", tarfile.CHRTYPE)],
}


@pytest.mark.parametrize("data_filter", [True, False], ids=["data_filter", "no_data_filter"])
@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_unpacking_refuses_links_and_escaping_paths_on_every_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    kind: str, data_filter: bool,
) -> None:
    if not data_filter:  # the Python that lacks it (3.10 before 3.10.12, 3.11 before 3.11.4)
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    outside = tmp_path / "outside"
    outside.mkdir()
    archive = _archive(tmp_path / "job.tar.gz", *HOSTILE[kind](outside))
    dest = tmp_path / "host" / "jobs" / "abc"
    code = job.main(["unpack", str(archive), str(dest)])
    (line,) = capsys.readouterr().err.splitlines()
    assert code == 1 and line.startswith("error: ") and "refused" in line
    assert list(outside.iterdir()) == [] and not dest.exists()
    assert not (tmp_path / "host" / "owned").exists() and not (tmp_path / "owned").exists()


@pytest.mark.parametrize("data_filter", [True, False], ids=["data_filter", "no_data_filter"])
def test_a_packed_workdir_unpacks_whole_without_the_data_filter_too(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data_filter: bool,
) -> None:
    archive = jobs.pack_workdir(project)
    if not data_filter:
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    dest = tmp_path / "host" / "abc"
    assert job.unpack(archive.path, dest) == "unpacked"
    for rel, text in CODE.items():
        assert (dest / rel).read_text() == text
    assert job.unpack(archive.path, dest) == "reused"


# ---------------------------------------------------------------- files that cannot be packed


@pytest.mark.parametrize(("name", "content", "expected"), [
    (".cloudprofignore", b"ok.txt\n!\n", ".cloudprofignore, line 2: '!'"),
    (".cloudprofignore", b"ok.txt\n\\\n", ".cloudprofignore, line 2"),
    (".gitignore", b"\xff\xfe*.log\n", ".gitignore is not UTF-8"),
])
def test_an_ignore_file_that_cannot_be_used_is_one_line_naming_it(
    project: Path, name: str, content: bytes, expected: str,
) -> None:
    (project / name).write_bytes(content)
    with pytest.raises(UsageError) as info:
        jobs.pack_workdir(project)
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_a_file_name_that_is_not_utf8_is_one_line_naming_it(project: Path) -> None:
    (project / "data").joinpath(b"r\xe9sum\xe9.csv".decode("utf-8", "surrogateescape")) \
        .write_text("x\n")
    with pytest.raises(UsageError) as info:
        jobs.pack_workdir(project)
    assert "'data/r\\xe9sum\\xe9.csv' is not UTF-8" in str(info.value)


@pytest.mark.parametrize("what", ["file", "directory"])
def test_a_file_or_directory_that_cannot_be_read_is_one_line_naming_it(what: str) -> None:
    """Not silently left out (the job would run without it): the sweep stops first. Where the
    tests run as root, who reads everything, the sweep runs as root without capabilities
    (no CAP_DAC_OVERRIDE): a mode-0 file is then unreadable, while the checkout and its
    venv (root's own, wherever the clone lives) stay readable."""
    import os
    import shutil
    import subprocess
    import sys
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="cloudprof-unreadable-"))
    try:
        base.chmod(0o777)
        project = base / "project"
        (project / "src").mkdir(parents=True)
        (project / "job.py").write_text("print(1)\n")
        (project / "src" / "model.py").write_text("x = 1\n")
        for path in (project, project / "src"):
            path.chmod(0o755)
        for path in (project / "job.py", project / "src" / "model.py"):
            path.chmod(0o644)
        hidden = project / "src" if what == "directory" else project / "src" / "model.py"
        hidden.chmod(0)
        as_user = (["setpriv", "--bounding-set=-all", "--inh-caps=-all"]
                   if os.geteuid() == 0 else [])
        repo = Path(__file__).resolve().parents[1]
        proc = subprocess.run(
            [*as_user, sys.executable, "-m", "orchestrator", "sweep", "--plan", "--dry-run",
             "--machine", "n2-highcpu-2", "--workdir", str(project),
             "--command", "python job.py", "--out", str(base / "runs")],
            capture_output=True, text=True, timeout=60, cwd=base,
            env={**os.environ, "PYTHONPATH": str(repo), "CLOUDPROF_CACHE": str(base / "cache"),
                 "HOME": str(base)})
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr
        assert lines[0].startswith(f"error: --workdir: cannot read {hidden}: Permission denied")
        assert not (base / "runs").exists() and not (base / "cache").exists()
    finally:
        for path in base.rglob("*"):
            if not path.is_symlink():
                path.chmod(0o755)
        shutil.rmtree(base, ignore_errors=True)
