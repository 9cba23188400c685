"""The planner's arithmetic: worker lists, trial expansion, estimates and cost."""

from __future__ import annotations

import io
import json
import re

import pytest
from rich.console import Console

from orchestrator.catalog.machines import MachineType
from orchestrator.plan import planner
from orchestrator.plan.planner import Plan, default_workers, make_plan, new_sweep_id, render_plan
from orchestrator.providers.base import LABEL_SWEEP
from orchestrator.spec.spec import SweepSpec


def machine(name: str = "n2-highcpu-8", vcpus: int = 8, price: float | None = 0.36,
            spot: float | None = 0.09, provider: str = "gcp") -> MachineType:
    return MachineType(provider=provider, name=name, family=name.split("-")[0], vcpus=vcpus,
                       memory_gib=8.0, region="us-central1", price_on_demand=price,
                       price_spot=spot, price_source="test", price_date="2024-06-01")


@pytest.mark.parametrize(
    ("vcpus", "expected"),
    [
        (80, [1, 2, 4, 8, 16, 32, 64, 80, 160]),
        (60, [1, 2, 4, 8, 16, 32, 60, 120]),
        (64, [1, 2, 4, 8, 16, 32, 64, 128]),
        (6, [1, 2, 4, 6, 12]),
        (2, [1, 2, 4]),
        (1, [1, 2]),
    ],
)
def test_default_workers(vcpus: int, expected: list[int]) -> None:
    assert default_workers(vcpus) == expected


def test_default_workers_rejects_zero() -> None:
    with pytest.raises(ValueError):
        default_workers(0)


def test_make_plan_expands_trials_per_machine_and_estimates() -> None:
    spec = SweepSpec(machines=["n2-highcpu-8", "c2-standard-4"], workers=[1, 2, 4], repeats=2,
                     duration_s=10.0, workload_params={"frames": "4", "inputs": "/x"})
    m1, m2 = machine(), machine("c2-standard-4", vcpus=4, price=0.2, spot=None)
    plan = make_plan(spec, "20260101-000000-abcd", [m1, m2], input_bytes=200_000_000)

    assert [vm.machine.name for vm in plan.vms] == ["n2-highcpu-8", "c2-standard-4"]
    vm = plan.vms[0]
    assert len(vm.trials) == 6  # 3 worker counts x 2 repeats, one VM
    ids = [t.trial_id for t in vm.trials]
    assert len(set(ids)) == 6 and "n2-highcpu-8-w4-r1" in ids
    assert [(t.workers, t.repeat) for t in vm.trials][:3] == [(1, 0), (2, 0), (4, 0)]
    request = vm.trials[2].request
    assert request.workers == 4 and request.duration_s == 10.0
    assert dict(request.params) == {"frames": "4"}  # the inputs path is the host's, added there
    args = request.argv()
    assert args[args.index("--workers") + 1] == "4"
    assert args[args.index("--duration") + 1] == "10"
    assert "frames=4" in args and not any(a.startswith("inputs=") for a in args)

    e = vm.estimate
    assert e.boot_s == planner.BOOT_S["gcp"] and e.teardown_s == planner.TEARDOWN_S["gcp"]
    assert e.trials_s == pytest.approx(6 * (10.0 + planner.TRIAL_OVERHEAD_S))
    assert e.staging_s == pytest.approx(
        planner.STAGING_FIXED_S + 200_000_000 / planner.STAGING_BYTES_PER_S)
    total = e.boot_s + e.bootstrap_s + e.staging_s + e.trials_s + e.teardown_s
    assert e.total_s == pytest.approx(total)
    assert e.cost_usd == pytest.approx(0.36 * total / 3600)

    # VMs run concurrently: wall time is the longest VM, cost is the sum.
    assert plan.total_s == pytest.approx(max(v.estimate.total_s for v in plan.vms))
    assert plan.total_cost_usd == pytest.approx(
        sum(v.estimate.cost_usd for v in plan.vms))  # type: ignore[misc]
    assert vm.labels[LABEL_SWEEP] == "20260101-000000-abcd"
    assert vm.zone == "us-central1-a" and vm.region == "us-central1"


def test_default_workers_used_when_spec_has_none_and_spot_price() -> None:
    spec = SweepSpec(repeats=1, machines=["n2-highcpu-8"], spot=True, duration_s=3)
    plan = make_plan(spec, "s", [machine()])
    assert [t.workers for t in plan.vms[0].trials] == default_workers(8)
    assert plan.vms[0].spot and plan.vms[0].estimate.price_per_hour == 0.09


def test_unknown_price_gives_unknown_cost() -> None:
    spec = SweepSpec(repeats=1, machines=["box"], workers=[1], provider="ssh")
    plan = make_plan(spec, "s", [machine("box", price=None, spot=None, provider="ssh")])
    assert plan.vms[0].estimate.cost_usd is None and plan.total_cost_usd is None
    assert plan.vms[0].estimate.boot_s == 0  # an existing host does not boot


def test_names_are_cloud_safe() -> None:
    sid = new_sweep_id()
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{4}", sid)
    assert new_sweep_id() != new_sweep_id()
    name = planner.vm_name(sid, "c6i.Large_x" + "y" * 80)
    assert re.fullmatch(r"[a-z][a-z0-9-]{0,61}[a-z0-9]", name)
    assert planner.trial_id("a b/c", 4, 0) == "a-b-c-w4-r0"


def test_plan_round_trips_through_json() -> None:
    spec = SweepSpec(repeats=1, machines=["n2-highcpu-8"], workers=[1, 2])
    plan = make_plan(spec, "s1", [machine()])
    plan.uploads = [planner.Upload("inputs/h/frame_0000.parquet", 10)]
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["estimated_total_cost_usd"] == pytest.approx(plan.total_cost_usd)
    back = Plan.from_dict(data)
    assert back == plan


def test_render_plan_lists_every_action() -> None:
    spec = SweepSpec(repeats=1, machines=["n2-highcpu-8"], workers=[1, 16])
    plan = make_plan(spec, "s2", [machine()])
    plan.uploads = [planner.Upload(f"inputs/h/frame_{i:04d}.parquet", 1000) for i in range(10)]
    out = io.StringIO()
    render_plan(plan, Console(file=out, width=200), dry_run=True)
    text = out.getvalue()
    assert "would be created" in text and plan.vms[0].name in text
    assert "us-central1-a" in text and "spot no" in text
    assert "inputs/h/frame_0000.parquet" in text and "5 more" in text
    assert text.count("python -m workloads.run") == 2 and "--workers 16" in text
    assert "estimated cost $" in text and "estimates, not measurements" in text


def test_the_plan_says_where_each_price_comes_from_and_warns_when_it_is_old() -> None:
    from dataclasses import replace
    from datetime import date, timedelta

    from orchestrator.catalog.machines import lookup

    shipped = replace(lookup("n2-highcpu-8"), price_source="offline estimate (not fetched): "
                      "a test rate", price_date=(date.today() - timedelta(days=200)).isoformat(),
                      fetched_at="")
    fresh = replace(lookup("c2-standard-4"), price_source="Cloud Billing Catalog API",
                    price_date=(date.today() - timedelta(days=3)).isoformat(),
                    fetched_at="2026-01-01T00:00:00Z")
    spec = SweepSpec(repeats=1, machines=["n2-highcpu-8", "c2-standard-4"], workers=[1])
    out = io.StringIO()
    render_plan(make_plan(spec, "s3", [shipped, fresh]), Console(file=out, width=200),
                dry_run=True)
    text = out.getvalue()
    age = (date.today() - date.fromisoformat(shipped.price_date)).days
    assert f"(shipped offline estimate of {shipped.price_date}, {age} days old)" in text
    assert "(fetched " in text and ", 3 days old)" in text
    warning = next(line for line in text.splitlines() if line.startswith("warning:"))
    assert "n2-highcpu-8" in warning and "c2-standard-4" not in warning
    assert "cloudprof catalog refresh" in warning

    out = io.StringIO()
    render_plan(make_plan(SweepSpec(repeats=1,
                                    machines=["c2-standard-4"], workers=[1]), "s4", [fresh]),
                Console(file=out, width=200), dry_run=True)
    assert "warning:" not in out.getvalue()


def test_a_warmup_reaches_the_runner_and_is_counted_in_the_estimate() -> None:
    spec = SweepSpec(repeats=1,
                     machines=["n2-highcpu-8"], workers=[1, 2], duration_s=10.0, warmup_s=5.0)
    vm = make_plan(spec, "20260101-000000-abcd", [machine()], input_bytes=0).vms[0]
    args = vm.trials[0].request.argv()
    assert args[args.index("--warmup") + 1] == "5"
    assert vm.estimate.trials_s == pytest.approx(2 * (10.0 + 5.0 + planner.TRIAL_OVERHEAD_S))
    no_warmup = SweepSpec(repeats=1, machines=["n2-highcpu-8"], workers=[1], duration_s=10.0)
    plain = make_plan(no_warmup, "20260101-000000-abcd", [machine()], input_bytes=0).vms[0]
    assert "--warmup" not in plain.trials[0].request.argv()
def rendered(plan: Plan, **kw) -> str:
    out = io.StringIO()
    render_plan(plan, Console(file=out, width=200), dry_run=kw.pop("dry_run", False), **kw)
    return out.getvalue()


def test_repeats_of_one_trial_command_are_shown_once_with_a_count() -> None:
    spec = SweepSpec(machines=["n2-highcpu-8"], workers=[1, 4], repeats=3)
    text = rendered(make_plan(spec, "s3", [machine()]))
    assert text.count("python -m workloads.run") == 2  # 6 trials, 2 distinct commands
    assert text.count("× 3 repeats") == 2 and "(6 trials;" in text


def test_bucket_objects_not_listed_are_counted_with_their_bytes_and_predictions_say_so() -> None:
    plan = make_plan(SweepSpec(repeats=1,
                               machines=["n2-highcpu-8"], workers=[1]), "s4", [machine()])
    plan.uploads = [planner.Upload(f"inputs/h/frame_{i:04d}.parquet", 1024 * (i + 1), True)
                    for i in range(10)]
    text = rendered(plan)
    assert "(10, 55 KiB predicted;" in text  # 1+2+...+10 KiB
    listed = re.findall(r"frame_(\d{4})\.parquet\s+(\S+ KiB) predicted", text)
    assert [n for n, _ in listed] == ["0000", "0001", "0002", "0008", "0009"]
    assert "... 5 more objects, 30 KiB predicted" in text  # 4+5+6+7+8 KiB
    plan.uploads = [planner.Upload("inputs/h/a.parquet", 2048)]  # measured: no mark
    text = rendered(plan)
    assert "a.parquet  2 KiB\n" in text and "predicted" not in text


def test_an_ssh_host_outside_the_catalog_is_not_shown_as_zero_vcpus() -> None:
    host = MachineType(provider="ssh", name="box1", family="", vcpus=0, memory_gib=0.0,
                       region="", price_on_demand=None, price_spot=None, price_source="",
                       price_date="")
    plan = make_plan(SweepSpec(repeats=1,
                               machines=["box1"], workers=[1], provider="ssh"), "s5", [host])
    text = rendered(plan)
    assert "0 vCPUs" not in text and "0 GiB" not in text
    assert "box1 (size read from the host when connected)" in text
    assert "Host 1/1 to use" in text and "nothing is created" in text and "VM 1/1" not in text


def test_a_resumed_plan_shows_only_what_remains() -> None:
    spec = SweepSpec(repeats=1, machines=["n2-highcpu-8"], workers=[1, 2, 4])
    plan = make_plan(spec, "s6", [machine()])
    done = {"n2-highcpu-8-w1-r0", "n2-highcpu-8-w2-r0"}
    text = rendered(plan, done=done)
    assert "2 of 3 trials already done, 1 remain" in text and "1 of 3 trials remain" in text
    assert text.count("python -m workloads.run") == 1 and "--workers 4" in text


def test_a_resumed_plan_estimates_only_what_remains_and_skips_finished_machines() -> None:
    spec = SweepSpec(repeats=1,
                     machines=["n2-highcpu-8", "c2-standard-4"], workers=[1, 2], duration_s=60)
    plan = make_plan(spec, "s7", [machine(), machine("c2-standard-4", vcpus=4, price=0.2)])
    whole = rendered(plan)
    assert f"estimated cost {planner._cost(plan.total_cost_usd)} — estimates" in whole
    done = {t.trial_id for t in plan.vms[0].trials} | {"c2-standard-4-w1-r0"}
    text = rendered(plan, done=done)
    assert "n2-highcpu-8: all 2 trials done, not created" in text
    left = plan.vms[1].estimate
    cost = 0.2 * (left.total_s - left.trials_s / 2) / 3600  # one of two trials remains
    assert "Estimated of what remains wall time" in text
    assert f"estimated cost {planner._cost(cost)} — estimates" in text


def test_a_plan_of_one_repeat_says_how_sure_that_is_and_how_to_pick_repeats() -> None:
    one = rendered(make_plan(SweepSpec(repeats=1, machines=["n2-highcpu-8"], workers=[1, 4]), "s4",
                             [machine()]))
    assert "one repeat per worker count: no spread is measured" in one
    assert "Picking repeats and duration" in one
    three = rendered(make_plan(SweepSpec(machines=["n2-highcpu-8"], workers=[1, 4], repeats=3),
                               "s5", [machine()]))
    assert "one repeat per worker count" not in three
