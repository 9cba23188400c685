"""A generated corpus of bad inputs: every one is a single ``error:`` line on stderr and a
non-zero exit, with no traceback, no hang and nothing created — before anything is paid for.

The cases come from a table of options × bad values, each given on the command line and,
for the sweep's options, again as a ``sweep.toml`` key; a few hand-made files (a FIFO, a
deeply nested TOML, a foreign Parquet table, a workdir with a bad ignore line) join them.
All run in this process through the CLI's own entry (``cli.main``), each under an alarm
that turns a hang into a failure.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator import cli

HANG_S = 10  # no bad input may take longer than this to be refused

# A sweep that would be fine but for the one bad option each case adds (a dry run: no
# cloud, nothing to pay even if a case slipped through, which the run-dir check catches).
BASE_OPTIONS = {"--machine": "n2-highcpu-8", "--workers": "1", "--duration": "0.5",
                "--repeats": "1", "--frames": "2", "--rows": "20", "--cols": "20", "--dim": "4"}
BASE = ["--dry-run", *(word for pair in BASE_OPTIONS.items() for word in pair)]

BASE_TOML = {"dry_run": "true", "machines": '["n2-highcpu-8"]', "workers": '"1"',
             "duration": '"0.5"', "repeats": "1", "frames": "2", "rows": "20", "cols": "20",
             "dim": "4"}


def _base_without(given: list[str]) -> list[str]:
    """BASE less the option the case gives (``--param frames=...`` counts as --frames),
    which would otherwise win over it."""
    flag, value = given[0], given[1] if len(given) > 1 else ""
    drop = {flag, f"--{value.split('=', 1)[0]}" if flag == "--param" else flag}
    return ["--dry-run", *(word for option, arg in BASE_OPTIONS.items() if option not in drop
                           for word in (option, arg))]


INTEGERS = ["0", "-1", "abc", "1.5", "", "1e3", "0x10", "9" * 40]
SWEEP_VALUES: dict[str, list[str]] = {
    "--repeats": [*INTEGERS, "101", "1000000000000"],
    "--frames": [*INTEGERS, "10001", "10000000000"],
    "--rows": [*INTEGERS, "100001", "10000000000"],
    "--cols": [*INTEGERS, "100001", "10000000000"],
    "--dim": INTEGERS,
    "--seed": ["-1", "abc", "1.5", ""],
    "--workers": ["0", "-1", "a", "", "1-", "4-2", "1-10000", "1,,2", "1-64:x1", "1-8:0",
                  "99999", "1;2", "4097"],
    "--nodes": ["0", "-1", "abc", "", "2-1"],
    "--duration": ["0", "-1", "abc", "", "1e999", "nan", "inf", "99999999999d", "5x", "-5m",
                   "0.0000001", "0.05s"],
    "--warmup": ["-1", "abc", "nan", "inf", "99999999999d"],
    "--sample-hz": ["-1", "1000", "nan", "abc", "inf", ""],
    "--max-cost": ["0", "-1", "abc", "nan", ""],
    "--max-peak-memory": ["abc", "0", "-1G", "1Q", "", "nan"],
    "--machine": ["", "no-such-machine", "a;rm -rf /", "../x", "x" * 100, "n2-highcpu-8 "],
    "--region": ["a;b", "", "../x", "us central"],
    "--zone": ["a;b", "", "us-east1-b"],
    "--project": ["a;b", "", "../x"],
    "--bucket": ["s3://Bad_Bucket;rm", "s3://", "gs://A", "", "s3://a", "gs://x/../y",
                 "s3://b b"],
    "--out": ["", "/dev/null/runs", "/proc/version"],
    "--workdir": ["", "/nonexistent/project", "/proc/version"],
    "--hosts": ["", "/nonexistent/hosts.toml"],
    "--ssh-key": ["", "/nonexistent/key"],
    "--grid": ["x", "=1", "x=", "x=a,a", "1x=a", "workers=1", "x=a b,a-b", "x=,", "x=a/b,a?b",
               "a-b=1"],
    "--param": ["frames=abc", "frames=0", "frames=99999999", "x", "password=abc", "=1",
                "rows=-5", "token=x"],
    "--workload": ["nope", "a:b:c", "", "1bad:Cls", "workloads.nope:Cube", "os:system",
                   "json:JSONDecoder", "workloads.base:run_threads"],
    "--strategy": ["nope", "", "a;b"],
    "--profile": ["nope", ""],
    "--provider": ["nope", ""],
    "--command": ["", "python {nope}", "a 'b", "echo AKIAABCDEFGHIJKLMNOP"],
}
# sweep.toml keys for the same options (a value as the file would hold it, as a string)
TOML_KEYS = {"--repeats": "repeats", "--frames": "frames", "--rows": "rows", "--cols": "cols",
             "--dim": "dim", "--workers": "workers", "--duration": "duration",
             "--warmup": "warmup", "--sample-hz": "sample_hz", "--machine": "machines",
             "--region": "region", "--bucket": "bucket", "--workload": "workload",
             "--strategy": "strategy", "--max-peak-memory": "max_peak_memory"}
TOML_TYPED = [("repeats", "1000"), ("repeats", "true"), ("repeats", "1.5"), ("frames", "0"),
              ("frames", "10001"), ("rows", "[1]"), ("workers", "[0]"), ("workers", "{a=1}"),
              ("duration", "-1"), ("grid", "{x = [[1]]}"), ("grid", "{x = []}"),
              ("machines", "[]"), ("machines", "[1]"), ("no_such_key", "1"),
              ("dry_run", "'yes'"), ("spot", "1"), ("max_cost", "-1"), ("out", "''"),
              ("workdir", "''"), ("params", "'x'"), ("params", "{password = 'x'}")]

# environment settings a sweep reads, each refused by spec validation, not by the VM
ENV_VALUES: list[tuple[str, str]] = [
    ("CLOUDPROF_SSH_ENDPOINT", "a b:22"), ("CLOUDPROF_SSH_ENDPOINT", "host:99999"),
    ("CLOUDPROF_SSH_ENDPOINT", "host;id"), ("CLOUDPROF_SSH_USER", "root;id"),
    ("CLOUDPROF_SSH_USER", "-oProxyCommand=x"), ("CLOUDPROF_SSH_USER", "a b"),
    ("CLOUDPROF_SSH_KEY", "/nonexistent/key"), ("CLOUDPROF_SSH_HOST_KEY", "/proc/version"),
    ("CLOUDPROF_SSH_WORKDIR", "relative/dir"), ("CLOUDPROF_SSH_WORKDIR", "/a b"),
    ("CLOUDPROF_SSH_PYTHON", "python3; id"), ("CLOUDPROF_SSH_BOOT_TIMEOUT", "abc"),
    ("CLOUDPROF_SSH_BOOT_TIMEOUT", "-5"), ("CLOUDPROF_SSH_SOURCE_CIDR", "nope"),
    ("CLOUDPROF_SSH_SOURCE_CIDR", "0.0.0.0/0"), ("CLOUDPROF_AWS_IMAGE", "ubuntu;rm"),
    ("CLOUDPROF_AWS_IMAGE", "ami-XYZ"), ("CLOUDPROF_GCE_ENDPOINT", "not a url"),
    ("CLOUDPROF_GCP_BILLING_ENDPOINT", "ftp://x"), ("CLOUDPROF_GCS_SIGNER", "nobody"),
    ("CLOUDPROF_MAX_WORKDIR", "lots"), ("CLOUDPROF_DELETE_BACKOFF_S", "soon"),
    ("CLOUDPROF_WARM_RUNNER", "maybe"), ("CLOUDPROF_CATALOG_DIR", "/nonexistent/catalog"),
]

OTHER_COMMANDS: list[list[str]] = [
    ["cleanup", "--sweep", ""], ["cleanup", "--sweep", " "], ["cleanup", "--sweep", "a;b"],
    ["cleanup", "--sweep", "../x"], ["cleanup", "--older-than", "abc"],
    ["cleanup", "--older-than", "-1h"], ["cleanup", "--older-than", ""],
    ["cleanup", "--bucket", "x;y"], ["cleanup", "--bucket", "s3://"],
    ["cleanup", "--provider", "nope"],
    ["report", ""], ["report", "/nonexistent/run"], ["report", "/proc/version"],
    ["compare", "/nonexistent/a"], ["compare", "/nonexistent/a", "/nonexistent/b"],
    ["catalog", "--min-vcpus", "abc"], ["catalog", "--max-price", "abc"],
    ["catalog", "--provider", "nope"], ["catalog", "--sort", "nope"],
    ["catalog", "--format", "nope"],
    ["sweep", "--resume", "/nonexistent/run"], ["sweep", "--resume", ""],
    ["sweep", "--nope"], ["nope"],
]


def _cases() -> Iterator[Any]:
    for flag, values in SWEEP_VALUES.items():
        for value in values:
            yield pytest.param("cli", [flag, value], id=f"{flag}={value[:24]!r}")
            if flag in TOML_KEYS:
                toml = f"{TOML_KEYS[flag]} = {json.dumps(value)}"
                yield pytest.param("toml", [toml], id=f"toml:{toml[:40]}")
    for key, value in TOML_TYPED:
        yield pytest.param("toml", [f"{key} = {value}"], id=f"toml:{key}={value}")
    for argv in OTHER_COMMANDS:
        yield pytest.param("argv", argv, id=" ".join(repr(a) for a in argv))
    for kind in SPECIAL_FILES:
        yield pytest.param("file", [kind], id=f"file:{kind}")
    for name, value in ENV_VALUES:
        yield pytest.param("env", [name, value], id=f"env:{name}={value!r}")


def _special(tmp: Path, kind: str) -> list[str]:
    """argv for one of the hand-made files (made under ``tmp``)."""
    if kind == "config-fifo":
        os.mkfifo(tmp / "sweep.toml")
        return ["sweep", "--config", str(tmp / "sweep.toml")]
    if kind == "config-dir":
        return ["sweep", "--config", str(tmp)]
    if kind == "config-device":
        return ["sweep", "--config", "/dev/zero"]
    if kind == "config-deep":
        (tmp / "sweep.toml").write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
        return ["sweep", "--config", str(tmp / "sweep.toml")]
    if kind == "config-not-utf8":
        (tmp / "sweep.toml").write_bytes(b"machines = ['\xff']\n")
        return ["sweep", "--config", str(tmp / "sweep.toml")]
    if kind == "config-invalid":
        (tmp / "sweep.toml").write_text("machines = [\n")
        return ["sweep", "--config", str(tmp / "sweep.toml")]
    if kind == "config-huge":
        (tmp / "sweep.toml").write_text("# x\n" * 400_000)
        return ["sweep", "--config", str(tmp / "sweep.toml")]
    if kind == "config-missing":
        return ["sweep", "--config", str(tmp / "nope.toml")]
    project = tmp / "project"
    project.mkdir()
    (project / "job.py").write_text("print(1)\n")
    job = ["sweep", *BASE, "--workdir", str(project), "--command", "python job.py"]
    if kind == "workdir-bang":
        (project / ".cloudprofignore").write_text("!\n")
    elif kind == "workdir-backslash":
        (project / ".cloudprofignore").write_text("\\\n")
    elif kind == "workdir-ignore-not-utf8":
        (project / ".gitignore").write_bytes(b"\xff\n")
    elif kind == "workdir-name-not-utf8":
        (project / os.fsdecode(b"\xff.py")).write_text("x\n")
    elif kind == "grid-unused":  # every x would run the same trial
        return [*job, "--grid", "x=a,b"]
    elif kind == "workdir-empty":
        (project / ".cloudprofignore").write_text("*\n")
    elif kind == "setup-without-workdir":
        return ["sweep", *BASE, "--setup", "pip install x"]
    elif kind == "shell-without-command":
        return ["sweep", *BASE, "--shell"]
    elif kind == "grid-product":
        values = ",".join(str(i) for i in range(100))
        return ["sweep", *BASE, "--grid", f"x={values}", "--grid", f"y={values}"]
    elif kind == "trials-product":
        return ["sweep", *BASE, "--workers", "1-2000", "--repeats", "10"]
    elif kind in ("hosts-encrypted-key", "hosts-missing-key"):
        key = tmp / "key"
        if kind == "hosts-encrypted-key":
            _write_encrypted_key(key)
        hosts = tmp / "hosts.toml"
        hosts.write_text(f'[[hosts]]\naddress = "127.0.0.1"\nuser = "me"\nkey_file = "{key}"\n')
        return ["sweep", "--provider", "ssh", "--hosts", str(hosts), "--workers", "1",
                "--duration", "0.5", "--repeats", "1"]
    return job


def _write_encrypted_key(path: Path) -> None:
    """An OpenSSH private key under a passphrase, as ssh-keygen -N writes one."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    path.write_bytes(Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
        serialization.BestAvailableEncryption(b"secret")))


SPECIAL_FILES = ["config-fifo", "config-dir", "config-device", "config-deep", "config-not-utf8",
                 "config-invalid", "config-huge", "config-missing", "workdir-bang",
                 "workdir-backslash", "workdir-ignore-not-utf8", "workdir-name-not-utf8",
                 "workdir-empty", "setup-without-workdir", "shell-without-command",
                 "grid-product", "trials-product", "hosts-encrypted-key", "hosts-missing-key",
                 "grid-unused"]


class _Hang(Exception):
    pass


@pytest.fixture
def alarm() -> Iterator[None]:
    def ring(signum: int, frame: Any) -> None:
        raise _Hang(f"no answer in {HANG_S} s")

    previous = signal.signal(signal.SIGALRM, ring)
    signal.alarm(HANG_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize(("form", "given"), list(_cases()))
def test_a_bad_input_is_one_line_and_a_non_zero_exit_and_creates_nothing(
    form: str, given: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], alarm: None,
) -> None:
    monkeypatch.chdir(tmp_path)  # anything written by mistake lands here, and is seen
    monkeypatch.setenv("CLOUDPROF_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "runs"
    if form == "cli":
        argv = ["sweep", *_base_without(given), "--out", str(out), *given]
    elif form == "toml":  # the whole sweep in the file (flags would override it), one key bad
        key = given[0].split("=", 1)[0].strip()
        lines = [f"{k} = {v}" for k, v in BASE_TOML.items() if k != key]
        (tmp_path / "sweep.toml").write_text("\n".join([*lines, given[0]]) + "\n")
        argv = ["sweep", "--out", str(out), "--config", str(tmp_path / "sweep.toml")]
    elif form == "env":
        monkeypatch.setenv(given[0], given[1])
        argv = ["sweep", *BASE, "--out", str(out)]
    elif form == "file":
        argv = _special(tmp_path, given[0])
        if argv[0] == "sweep" and "--config" not in argv:
            argv = [*argv, "--out", str(out)]
    else:
        argv = given
    before = sorted(p.name for p in tmp_path.iterdir())

    code = cli.main(argv)

    stdout, stderr = capsys.readouterr()
    assert code != 0, (stdout[-500:], stderr)
    assert "Traceback" not in stdout + stderr
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing made, not even here


def test_the_corpus_is_a_few_hundred_cases() -> None:
    assert len(list(_cases())) >= 300
