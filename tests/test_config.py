"""From flags and sweep.toml to a validated SweepSpec: parsing, precedence, and every refusal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import BucketError, UnknownMachineError, UsageError
from orchestrator.spec.config import build_spec, load_run_spec, read_config
from orchestrator.spec.options import CONFIG_KEYS
from orchestrator.spec.spec import SweepSpec
from orchestrator.spec.values import (
    check_bucket,
    check_output_dir,
    parse_duration,
    parse_host,
    parse_param,
    parse_size,
    parse_workers,
)


def spec_of(tmp_path: Path, config: Path | None = None, **cli: Any) -> SweepSpec:
    cli.setdefault("out", str(tmp_path / "runs"))
    return build_spec(cli, config)


def one_line_usage_error(exc: pytest.ExceptionInfo[Exception]) -> str:
    message = str(exc.value)
    assert isinstance(exc.value, UsageError | BucketError)
    assert "\n" not in message and message
    return message


# ---------------------------------------------------------------- worker lists


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1,2,4,8", [1, 2, 4, 8]),
        ("8, 4,4 ,1", [1, 4, 8]),
        ("1-4", [1, 2, 3, 4]),
        ("1-64:x2", [1, 2, 4, 8, 16, 32, 64]),
        ("1-80:x2,80", [1, 2, 4, 8, 16, 32, 64, 80]),
        ("3-20:x3", [3, 9]),
        ("8-32:8", [8, 16, 24, 32]),
        ("1,60-62,96", [1, 60, 61, 62, 96]),
        (6, [6]),
        ([1, 2, "4-5"], [1, 2, 4, 5]),
    ],
)
def test_worker_lists(text: Any, expected: list[int]) -> None:
    assert parse_workers(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", "must be 1 or more, got 0"),
        ("1,0,2", "must be 1 or more, got 0"),
        ("-1", "must be 1 or more, got -1"),
        ("1,-4", "must be 1 or more, got -4"),
        ("0-4", "must be 1 or more, got '0-4'"),
        ("8-4", "ends before it starts"),
        ("1-8:x1", "factor in '1-8:x1' must be 2 or more"),
        ("1-8:0", "step in '1-8:0' must be 1 or more"),
        ("four", "cannot read 'four'"),
        ("1,,2", "cannot read ''"),
        ("1-99999", "more than the 4096 allowed"),
        (True, "expected worker counts"),
        ([0, 1], "must be 1 or more, got 0"),
    ],
)
def test_bad_worker_lists(text: Any, expected: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_workers(text)
    assert expected in one_line_usage_error(info)


# ---------------------------------------------------------------- sizes, durations, params


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2G", 2 * 1024**3),
        ("2g", 2 * 1024**3),
        ("512MiB", 512 * 1024**2),
        ("1.5GB", 1_500_000_000),
        ("64K", 65536),
        ("1T", 1024**4),
        ("1000", 1000),
        (4096, 4096),
    ],
)
def test_sizes(text: Any, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["0", "0G", "-1G", "2X", "G", "lots", True, ""])
def test_bad_sizes(text: Any) -> None:
    with pytest.raises(UsageError) as info:
        parse_size(text)
    assert "--max-peak-memory" in one_line_usage_error(info)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("5", 5.0), ("0.5", 0.5), ("90s", 90.0), ("2m", 120.0), ("1.5h", 5400.0), ("1d", 86400.0)],
)
def test_durations(text: str, expected: float) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["0", "-5", "5x", "1hour", "", "nan", "inf"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(UsageError):
        parse_duration(text)


def runner_accepts(*args: str) -> bool:
    """Whether ``python -m workloads.run`` parses these options (its own parser, in-process)."""
    from workloads import runner_args

    try:
        runner_args.build_parser().parse_args(["--out", "x", *args])
    except runner_args.UsageError:
        return False
    return True


@pytest.mark.parametrize("hz", ["-1", "0", "0.5", "10", "100", "100.5", "1000", "nan", "inf"])
def test_the_sweep_takes_exactly_the_sample_rates_the_runner_takes(tmp_path: Path, hz: str) -> None:
    try:
        spec = spec_of(tmp_path, machines=["c6i.large"], sample_hz=hz)
    except UsageError as exc:
        assert one_line_usage_error(pytest.ExceptionInfo.from_exc_info(
            (type(exc), exc, exc.__traceback__))).startswith("--sample-hz: ")
        assert not runner_accepts("--sample-hz", hz), f"the sweep refuses {hz}, the runner not"
    else:
        assert runner_accepts("--sample-hz", hz), f"the sweep takes {hz}, the runner refuses it"
        assert spec.sample_hz == float(hz)
    assert runner_accepts("--sample-hz", "0") and not runner_accepts("--sample-hz", "1000")


@pytest.mark.parametrize("text", ["99999999999d", "8d", "604801"])
def test_a_duration_beyond_seven_days_is_refused_by_the_sweep_and_the_runner(
    tmp_path: Path, text: str
) -> None:
    with pytest.raises(UsageError, match=r"^--duration: .* is too long: .*7 days"):
        spec_of(tmp_path, machines=["c6i.large"], duration=text)
    assert spec_of(tmp_path, machines=["c6i.large"], duration="7d").duration_s == 7 * 86400
    assert not runner_accepts("--duration", str(parse_duration(text)))
    assert runner_accepts("--duration", str(7 * 86400))
    assert parse_duration("30d", "--older-than") == 30 * 86400  # other durations are not trials


def test_params_hosts_and_buckets() -> None:
    assert parse_param("path=/data/a=b c") == ("path", "/data/a=b c")
    for bad in ("novalue", "=x", "two words=1", "a-b=1"):
        with pytest.raises(UsageError):
            parse_param(bad)
    for good in ("me@10.0.0.5", "me@host.example:2222", "10.0.0.5"):
        assert parse_host(good) == good
    for bad in ("me@host;id", "me@host:99999", "me@$(id)", "me@host:", "@host"):
        with pytest.raises(UsageError, match="--host"):
            parse_host(bad)
    for good in ("gs://my-bucket", "s3://my.bucket-1/prefix/x", "/tmp/local-bucket", "file:///x"):
        assert check_bucket(good) == good
    for bad in ("gs://My_Bucket", "s3://ab", "gs://-bucket", "s3://a..b", "ftp://x", "gs://ok/a b"):
        with pytest.raises(BucketError):
            check_bucket(bad)


def test_unwritable_output_directory_is_a_usage_error(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    for bad in (a_file, a_file / "runs", a_file / "deeper" / "runs"):
        with pytest.raises(UsageError) as info:
            check_output_dir(bad)
        message = one_line_usage_error(info)
        assert message.startswith(f"--out: output directory '{bad}' cannot be created")
        assert f"'{a_file}' is not a directory" in message
    with pytest.raises(UsageError, match="cannot be created"):
        spec_of(tmp_path, machines=["n2-highcpu-80"], out=str(a_file))
    # a good directory is checked without being created, and nothing is left behind
    assert check_output_dir(tmp_path / "new" / "runs") == tmp_path / "new" / "runs"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]
    spec_of(tmp_path, machines=["n2-highcpu-80"], out=str(tmp_path / "later"))
    assert not (tmp_path / "later").exists()


# ---------------------------------------------------------------- spec from flags


def test_flags_become_a_spec_with_the_catalog_provider(tmp_path: Path) -> None:
    spec = spec_of(
        tmp_path,
        machines=["n2-highcpu-80"],
        workers="1-8:x2",
        repeats=2,
        duration="2s",
        frames=4,
        strategy="numpy",
        params=["cache=/tmp/c"],
        max_peak_memory="2G",
        dry_run=True,
    )
    assert spec.provider == "gcp"
    assert spec.workers == [1, 2, 4, 8]
    assert spec.repeats == 2 and spec.duration_s == 2.0
    assert spec.workload_params == {"frames": 4, "strategy": "numpy", "cache": "/tmp/c"}
    assert spec.max_peak_memory == 2 * 1024**3 and spec.peak_gate == "lifetime"
    assert spec.dry_run is True and spec.spot is False
    assert spec.out == tmp_path / "runs"
    assert spec_of(tmp_path, machines=["c6i.large", "m7i.xlarge"]).provider == "aws"


@pytest.mark.parametrize(
    ("given", "gate"),
    [("300MiB", (300 * 2**20, "lifetime")), ("trial:300MiB", (300 * 2**20, "trial")),
     ("lifetime:1G", (2**30, "lifetime")), ("Trial: 2GB", (2 * 10**9, "trial"))],
)
def test_the_memory_gate_says_which_phase_it_covers(tmp_path: Path, given: str,
                                                    gate: tuple[int, str]) -> None:
    spec = spec_of(tmp_path, machines=["n2-highcpu-80"], max_peak_memory=given, dry_run=True)
    assert (spec.max_peak_memory, spec.peak_gate) == gate


def test_a_memory_gate_for_an_unknown_phase_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="'load' is not a phase; use SIZE, lifetime:SIZE or "
                       "trial:SIZE"):
        spec_of(tmp_path, machines=["n2-highcpu-80"], max_peak_memory="load:300MiB")


def test_provider_defaults_and_conflicts(tmp_path: Path) -> None:
    mixed = spec_of(tmp_path, machines=["n2-highcpu-2", "c6i.large"])  # one sweep, 2 clouds
    assert mixed.provider is None and mixed.machines == ["n2-highcpu-2", "c6i.large"]
    with pytest.raises(UsageError, match=r"'c6i\.large' is an aws machine type, not gcp"):
        spec_of(tmp_path, machines=["c6i.large"], provider="gcp")
    with pytest.raises(UsageError, match="unknown provider 'azure'"):
        spec_of(tmp_path, machines=["c6i.large"], provider="azure")
    with pytest.raises(UnknownMachineError, match="did you mean n2-highcpu-80"):
        spec_of(tmp_path, machines=["n2-highcpu-81"])
    # local and ssh take any (safe) name: the machine is whatever the host is
    assert spec_of(tmp_path, machines=["my-laptop"], provider="local").provider == "local"
    ssh = spec_of(tmp_path, hosts=["me@10.0.0.5:2222", "me@10.0.0.6"])
    assert ssh.provider == "ssh" and ssh.hosts == ["me@10.0.0.5:2222", "me@10.0.0.6"]
    assert ssh.machines == ["10.0.0.5-2222", "10.0.0.6"]  # every host, named by the provider
    one = spec_of(tmp_path, machines=["10.0.0.6"], hosts=["me@10.0.0.5:2222", "me@10.0.0.6"])
    assert one.machines == ["10.0.0.6"]
    with pytest.raises(UsageError, match="--machine 'lab-box' is not one of the ssh hosts: 10"):
        spec_of(tmp_path, machines=["lab-box"], hosts=["me@10.0.0.5:2222"])
    with pytest.raises(UsageError, match="--provider ssh needs --host"):
        spec_of(tmp_path, machines=["lab-box"], provider="ssh")
    with pytest.raises(UsageError, match="--host/--hosts are for --provider ssh, not gcp"):
        spec_of(tmp_path, machines=["n2-highcpu-2"], provider="gcp", hosts=["me@h"])
    with pytest.raises(UsageError, match="--spot applies to gcp and aws"):
        spec_of(tmp_path, machines=["box"], provider="local", spot=True)
    with pytest.raises(UsageError, match="no machine given"):
        spec_of(tmp_path)
    with pytest.raises(UsageError, match="given twice"):
        spec_of(tmp_path, machines=["c6i.large", "c6i.large"])


def test_one_sweep_across_clouds_and_ssh_hosts(tmp_path: Path) -> None:
    """Without --provider the machines may span GCP, AWS and the SSH hosts: each runs on its
    own provider; --region/--zone name one cloud's place, so only one cloud may be in it."""
    from orchestrator.spec.validate import machine_providers

    spec = spec_of(tmp_path, machines=["c6i.large", "n2-highcpu-2"], hosts=["me@10.0.0.5"])
    assert spec.provider is None
    assert spec.machines == ["c6i.large", "n2-highcpu-2", "10.0.0.5"]  # every host joins
    assert machine_providers(spec) == {"c6i.large": "aws", "n2-highcpu-2": "gcp",
                                       "10.0.0.5": "ssh"}
    one = spec_of(tmp_path, machines=["c6i.large", "10.0.0.6"],
                  hosts=["me@10.0.0.5", "me@10.0.0.6"], zone="eu-west-1b")
    assert one.machines == ["c6i.large", "10.0.0.6"] and one.region == "eu-west-1"
    with pytest.raises(UsageError, match="--region names one cloud's location and this sweep "
                       "spans gcp and aws"):
        spec_of(tmp_path, machines=["c6i.large", "n2-highcpu-2"], region="us-east-1")
    with pytest.raises(UsageError, match="--spot applies to gcp and aws, not the ssh hosts"):
        spec_of(tmp_path, machines=["c6i.large"], hosts=["me@10.0.0.5"], spot=True)
    search = spec_of(tmp_path, search="cost", family=["n2-highcpu,c6i"], vcpus="2-4")
    assert search.provider is None and set(machine_providers(search).values()) == {"gcp", "aws"}
    assert {"n2-highcpu-2", "c6i.large"} <= set(search.machines)
    with pytest.raises(UsageError, match=r"'nope' is not one of the ssh hosts: 10\.0\.0\.5 "
                       r"\(nor a machine type in the catalog\)"):
        spec_of(tmp_path, machines=["c6i.large", "nope"], hosts=["me@10.0.0.5"])


@pytest.mark.parametrize("name", ["n2-highcpu-80;reboot", "$(id)", "a b", "../etc", "x`y`"])
def test_machine_names_with_shell_metacharacters_are_refused(tmp_path: Path, name: str) -> None:
    for provider in (None, "local", "ssh"):
        with pytest.raises(UsageError) as info:
            spec_of(tmp_path, machines=[name], provider=provider, hosts=["me@h"])
        assert "use only letters, digits" in one_line_usage_error(info)


def test_zone_region_and_spot(tmp_path: Path) -> None:
    spec = spec_of(tmp_path, machines=["n2-highcpu-8"], zone="europe-west4-b", spot=True)
    assert spec.region == "europe-west4" and spec.zone == "europe-west4-b" and spec.spot
    assert spec_of(tmp_path, machines=["c6i.large"], zone="eu-west-1b").region == "eu-west-1"
    with pytest.raises(UsageError, match="--zone us-central1-a is not in --region europe-west4"):
        spec_of(tmp_path, machines=["n2-highcpu-8"], region="europe-west4", zone="us-central1-a")
    with pytest.raises(UsageError, match="no catalog price in region 'mars-north1'"):
        spec_of(tmp_path, machines=["n2-highcpu-8"], region="mars-north1")
    with pytest.raises(UsageError, match="'m2-ultramem-208' has no spot price"):
        spec_of(tmp_path, machines=["m2-ultramem-208"], spot=True)


def test_workload_parameters_are_checked_by_the_workload(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"unknown strategy 'bogus'.*fast"):
        spec_of(tmp_path, machines=["c6i.large"], strategy="bogus")
    with pytest.raises(UsageError, match="dim 100 exceeds rows 40"):
        spec_of(tmp_path, machines=["c6i.large"], dim=100, rows=40)
    with pytest.raises(UsageError, match="unknown parameter"):
        spec_of(tmp_path, machines=["c6i.large"], params=["colour=red"])
    with pytest.raises(UsageError, match=r"unknown consumer 'torch'.*view, contiguous, keep"):
        spec_of(tmp_path, machines=["c6i.large"], params=["consumer=torch"])
    assert spec_of(tmp_path, machines=["c6i.large"], params=["consumer=keep"]) \
        .workload_params["consumer"] == "keep"
    with pytest.raises(UsageError, match="unknown workload 'cub'; did you mean cube"):
        spec_of(tmp_path, machines=["c6i.large"], workload="cub")
    with pytest.raises(UsageError, match="--frames: must be 1 or more"):
        spec_of(tmp_path, machines=["c6i.large"], frames=0)


def test_a_users_workload_must_be_importable_here_without_running_its_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "src" / "mypkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise SystemExit('package code must not run')\n")
    (package / "mod.py").write_text(
        "import torch  # only the VM has it\n\n"
        "raise SystemExit('module code must not run')\n\n"
        "class MyWork(Workload):\n    pass\n"
    )
    (tmp_path / "src" / "broken.py").write_text("class MyWork(:\n")
    (tmp_path / "src" / "plain.py").write_text("def MyWork():\n    pass\n\nclass Bare:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    user = spec_of(tmp_path, machines=["c6i.large"], workload="mypkg.mod:MyWork", params=["x=1"])
    assert user.workload == "mypkg.mod:MyWork" and user.workload_params == {"x": "1"}
    for target, fragment in (
        ("nosuchmodule:Thing", "cannot import 'nosuchmodule': no such module"),
        ("mypkg.nope:MyWork", "cannot import 'mypkg.nope'"),
        ("mypkg.mod:Other", f"module 'mypkg.mod' ({package / 'mod.py'}) defines no 'Other'"),
        ("broken:MyWork", "cannot import 'broken'"),
        ("plain:MyWork", "'MyWork' is a function in"),
        ("plain:Bare", "'Bare' is a class with no base in"),
        ("os:system", "'system' is not a subclass of workloads.base.Workload"),
    ):
        with pytest.raises(UsageError) as info:
            spec_of(tmp_path, machines=["c6i.large"], workload=target)
        message = one_line_usage_error(info)
        assert message.startswith(f"--workload {target}: ") and fragment in message, message


def test_a_workload_is_also_looked_for_in_a_given_search_path(tmp_path: Path) -> None:
    from workloads.limits import check_workload_target

    (tmp_path / "job.py").write_text("from workloads.base import Workload as Job\n")
    check_workload_target("job:Job", search_path=[tmp_path])
    elsewhere = tmp_path / "elsewhere"
    with pytest.raises(ValueError, match=f"no such module in {elsewhere} or this Python's path"):
        check_workload_target("job:Job", search_path=[elsewhere])


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("api_key", "abc"),
        ("db_password", "hunter2"),
        ("token", "x"),
        ("AWS_SECRET_ACCESS_KEY", "x"),
        ("creds", "AKIAIOSFODNN7EXAMPLE"),
        ("pem", "-----BEGIN OPENSSH PRIVATE KEY-----"),
    ],
)
def test_secrets_are_refused_as_workload_parameters(tmp_path: Path, key: str, value: str) -> None:
    with pytest.raises(UsageError) as info:
        spec_of(tmp_path, machines=["c6i.large"], workload="m:W", params=[f"{key}={value}"])
    message = one_line_usage_error(info)
    assert message.startswith(f"workload parameter {key!r} looks like a credential")
    assert value not in message  # the secret is not echoed back
    config = tmp_path / "sweep.toml"
    config.write_text(f'machines = ["c6i.large"]\nworkload = "m:W"\n[params]\n{key} = "{value}"\n')
    with pytest.raises(UsageError, match="looks like a credential"):
        build_spec({"out": str(tmp_path / "runs")}, config)


def test_hosts_file_and_ssh_key_must_exist(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="--hosts: no such file"):
        spec_of(tmp_path, machines=["box"], hosts_file=str(tmp_path / "none.toml"))
    with pytest.raises(UsageError, match="--ssh-key: no such file"):
        spec_of(tmp_path, machines=["h"], hosts=["me@h"], ssh_key=str(tmp_path / "id"))
    hosts = tmp_path / "hosts.toml"
    hosts.write_text('[[hosts]]\nname = "bigbox"\naddress = "10.0.0.5"\nuser = "alice"\n')
    spec = spec_of(tmp_path, hosts_file=str(hosts))
    assert spec.provider == "ssh" and spec.machines == ["bigbox"] and spec.hosts_file == hosts
    hosts.write_text('[[hosts]]\naddress = "10.0.0.5"\ncolour = "red"\n')
    with pytest.raises(UsageError, match=r"hosts\.toml"):
        spec_of(tmp_path, hosts_file=str(hosts))


# ---------------------------------------------------------------- sweep.toml


def test_config_file_with_flag_overrides(tmp_path: Path) -> None:
    config = tmp_path / "conf" / "sweep.toml"
    config.parent.mkdir()
    config.write_text(
        """
machines = ["n2-highcpu-16", "c2-standard-8"]
workers = "1-16:x2"
repeats = 3
duration = "3s"
frames = 8
dim = 10
max-peak-memory = "1G"
max_cost = 2.5
spot = true
out = "results"
[params]
seed = 7
strategy = "threads"
"""
    )
    from_file = build_spec({}, config)
    assert from_file.machines == ["n2-highcpu-16", "c2-standard-8"]
    assert from_file.workers == [1, 2, 4, 8, 16]
    assert from_file.repeats == 3 and from_file.duration_s == 3.0
    assert from_file.workload_params == {"seed": "7", "strategy": "threads", "frames": 8, "dim": 10}
    assert from_file.max_peak_memory == 1024**3 and from_file.max_cost == 2.5
    assert from_file.spot is True and from_file.provider == "gcp"
    assert from_file.out == config.parent / "results"  # relative to the file

    overridden = build_spec(
        {
            "machines": ["n2-highcpu-32"],
            "workers": "2,4",
            "frames": 2,
            "params": ["strategy=numpy"],
            "spot": False,
            "out": str(tmp_path / "cli-runs"),
        },
        config,
    )
    assert overridden.machines == ["n2-highcpu-32"]
    assert overridden.workers == [2, 4]
    assert overridden.repeats == 3  # from the file
    assert overridden.workload_params == {
        "seed": "7",
        "strategy": "numpy",
        "frames": 2,
        "dim": 10,
    }
    assert overridden.spot is False
    assert overridden.out == tmp_path / "cli-runs"


def test_every_config_key_is_accepted(tmp_path: Path) -> None:
    """The README's table and the parser agree: a file using each key reads back."""
    assert set(CONFIG_KEYS) >= {"machines", "workers", "max_peak_memory", "hosts_file", "out"}
    config = tmp_path / "s.toml"
    config.write_text('machine = "c6i.large"\nhost = "me@h"\nparam = ["a=1"]\n')
    assert read_config(config) == {
        "machines": ["c6i.large"],
        "hosts": ["me@h"],
        "params": {"a": "1"},
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("worker = [1, 2]", "unknown key 'worker'; did you mean 'workers'?"),
        ("max-peak-mem = '2G'", "unknown key 'max-peak-mem'; did you mean 'max_peak_memory'?"),
        ("zzz = 1", "unknown key 'zzz'; valid keys: machines, workers"),
        ("repeats = 'three'", "repeats: expected an integer, got 'three'"),
        ("workers = [1, 0]", "workers: worker counts must be 1 or more, got 0"),
        ("spot = 'yes'", "spot: expected true or false"),
        ("machines = [1]", "machines: expected a string or a list of strings"),
        ("bucket = 'gs://Bad_Name'", "bucket: invalid GCS bucket name 'Bad_Name'"),
        ("[params]\nx = [1]", "params: expected name = scalar value"),
    ],
)
def test_config_errors_name_the_file_and_key(tmp_path: Path, text: str, expected: str) -> None:
    config = tmp_path / "sweep.toml"
    config.write_text(text + "\n")
    with pytest.raises((UsageError, BucketError)) as info:
        build_spec({}, config)
    message = one_line_usage_error(info)
    assert message.startswith(str(config)) and expected in message


def test_malformed_toml_is_one_line_with_its_position(tmp_path: Path) -> None:
    config = tmp_path / "sweep.toml"
    config.write_text('machines = ["n2-highcpu-80"]\nworkers = [1, 2\nrepeats = 2\n')
    with pytest.raises(UsageError) as info:
        build_spec({}, config)
    message = one_line_usage_error(info)
    assert message.startswith(f"{config}: invalid TOML:") and "line 3" in message
    with pytest.raises(UsageError, match="cannot read"):
        build_spec({}, tmp_path / "absent.toml")
    (tmp_path / "bin.toml").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(UsageError, match="not UTF-8"):
        build_spec({}, tmp_path / "bin.toml")


def test_resume_reads_the_recorded_spec(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="is not a run directory"):
        load_run_spec(tmp_path)
    (tmp_path / "sweep.json").write_text("{not json")
    with pytest.raises(UsageError, match="cannot read the spec"):
        load_run_spec(tmp_path)
    spec = SweepSpec(repeats=1, machines=["n2-highcpu-4"], workers=[1, 2], out=tmp_path)
    (tmp_path / "sweep.json").write_text(json.dumps({"spec": spec.to_dict()}))
    assert load_run_spec(tmp_path) == spec


def test_the_documented_example_config_is_valid(tmp_path: Path) -> None:
    """The sweep.toml shown in the docs' command-line reference reads back as documented."""
    import re

    page = Path(__file__).resolve().parent.parent / "docs" / "reference" / "commands.md"
    section = page.read_text().split("## `sweep.toml`", 1)[1]
    example = re.search(r"```toml\n(.*?)```", section, re.S)
    assert example is not None
    config = tmp_path / "sweep.toml"
    config.write_text(example.group(1))
    spec = build_spec({}, config)
    assert spec.machines == ["n2-highcpu-80", "c2-standard-60"]
    assert spec.workers == [1, 2, 4, 8, 16, 32, 60, 64, 80]
    assert spec.provider == "gcp" and spec.max_peak_memory == 8 * 1024**3
    assert spec.out == tmp_path / "runs"


@pytest.mark.parametrize(("text", "expected"), [(None, 0.0), ("0", 0.0), ("0s", 0.0), ("5s", 5.0)])
def test_a_sweep_level_warmup_is_a_duration_that_may_be_zero(tmp_path, text, expected):
    cli: dict[str, Any] = {"machines": ["n2-highcpu-16"]}
    if text is not None:
        cli["warmup"] = text
    assert spec_of(tmp_path, **cli).warmup_s == expected


@pytest.mark.parametrize("text", ["-1", "soon", "5x"])
def test_a_bad_warmup_is_one_line_naming_the_flag(tmp_path, text):
    with pytest.raises(UsageError) as info:
        spec_of(tmp_path, machines=["n2-highcpu-16"], warmup=text)
    assert "--warmup" in one_line_usage_error(info)


def test_the_warmup_can_come_from_the_config_file(tmp_path):
    config = tmp_path / "sweep.toml"
    config.write_text('machines = ["n2-highcpu-16"]\nwarmup = "2s"\n')
    assert build_spec({"out": str(tmp_path / "runs")}, config).warmup_s == 2.0


def test_adaptive_with_a_grid_is_refused_in_one_line() -> None:
    with pytest.raises(UsageError, match="--adaptive picks worker counts"):
        build_spec({"machines": ["n2-highcpu-8"], "adaptive": True, "command": "true",
                    "grid": ["rows=1,2"]})
