"""A host's lifecycle in the engine (orchestrator.engine.host_session), one host at a time:
provision or reattach, connect, stage, release with retries — against a provider of the
test's own over the local provider's real work directories and subprocesses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

import pytest

from orchestrator.engine.context import SweepContext
from orchestrator.engine.host_session import DELETE_ATTEMPTS, HostSession, Preempted
from orchestrator.engine.inputs import StagedInputs
from orchestrator.errors import CapacityError, ProviderError
from orchestrator.providers.base import Instance, VmRequest
from orchestrator.providers.local import LocalProvider
from tests.fixtures.engine_rooms import logged, sweep_context


class CloudLike(LocalProvider):
    """A provider that creates machines (as a cloud does) on local work directories, and
    notes what it was asked; each test sets what fails."""

    name = "cloudlike"
    creates_machines = True
    requests: ClassVar[list[VmRequest]] = []
    deletes: ClassVar[list[str]] = []
    listed: ClassVar[list[Instance]] = []
    full_zones: ClassVar[set[str | None]] = set()  # create raises CapacityError there
    failing_deletes = 0  # this many deletions fail before one works
    vms_at_wait: ClassVar[list[dict]] = []  # sweep.json's VM records when wait_ready ran
    store_path: Path | None = None

    def create(self, req: VmRequest) -> Instance:
        CloudLike.requests.append(req)
        if req.zone in CloudLike.full_zones:
            raise CapacityError(f"{req.zone} is full (injected)", zone=req.zone,
                                next_zones=("zone-b",))
        return super().create(req)

    def wait_ready(self, inst: Instance, timeout: float = 600) -> Instance:
        if CloudLike.store_path is not None:
            CloudLike.vms_at_wait.append(json.loads(CloudLike.store_path.read_text())["vms"])
        return super().wait_ready(inst, timeout)

    def delete(self, inst: Instance) -> None:
        CloudLike.deletes.append(inst.id)
        if CloudLike.failing_deletes > 0:
            CloudLike.failing_deletes -= 1
            raise ProviderError("the cloud said no (injected)")

    def list(self, labels: dict[str, str]) -> list[Instance]:
        return list(CloudLike.listed)


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLOUDPROF_DELETE_BACKOFF_S", "0")
    monkeypatch.setattr(CloudLike, "requests", [])
    monkeypatch.setattr(CloudLike, "deletes", [])
    monkeypatch.setattr(CloudLike, "listed", [])
    monkeypatch.setattr(CloudLike, "full_zones", set())
    monkeypatch.setattr(CloudLike, "failing_deletes", 0)
    monkeypatch.setattr(CloudLike, "vms_at_wait", [])


def session(ctx: SweepContext) -> HostSession:
    vm = ctx.plan.vms[0]
    return HostSession(ctx, vm, ctx.providers["cloudlike"])


def vm_record(ctx: SweepContext) -> dict:
    (record,) = ctx.store.read_sweep()["vms"].values()
    return record


def test_a_vms_id_is_in_sweep_json_before_anything_waits_on_it(tmp_path: Path) -> None:
    ctx = sweep_context(tmp_path, CloudLike)
    CloudLike.store_path = ctx.store.run_dir / "sweep.json"
    host = session(ctx)
    host.bring_up()
    host.record_ready()
    (at_wait,) = CloudLike.vms_at_wait
    assert at_wait[host.vm.name]["state"] == "created"
    assert at_wait[host.vm.name]["id"] == host.vm.name
    record = vm_record(ctx)
    assert record["state"] == "ready" and record["labels"]["cloudprof-sweep"]
    assert int(record["labels"]["cloudprof-expires"]) > int(record["labels"]["cloudprof-created"])


def test_a_full_zone_is_left_for_the_next_one_once(tmp_path: Path) -> None:
    ctx = sweep_context(tmp_path, CloudLike)
    CloudLike.full_zones = {ctx.plan.vms[0].zone}
    host = session(ctx)
    host.bring_up()
    assert [r.zone for r in CloudLike.requests] == [ctx.plan.vms[0].zone, "zone-b"]
    assert host.inst is not None and host.inst.name == host.vm.name
    assert "trying zone-b once" in logged(ctx)


def test_a_second_full_zone_fails_the_machine_with_no_vm_left(tmp_path: Path) -> None:
    ctx = sweep_context(tmp_path, CloudLike)
    CloudLike.full_zones = {ctx.plan.vms[0].zone, "zone-b"}
    host = session(ctx)
    with pytest.raises(CapacityError, match="zone-b is full"):
        host.bring_up()
    assert len(CloudLike.requests) == 2 and host.inst is None
    assert vm_record(ctx)["state"] == "create_failed"


def test_a_resumed_sweep_reattaches_its_running_vm_instead_of_creating_one(
        tmp_path: Path) -> None:
    ctx = sweep_context(tmp_path, CloudLike, resuming=True)
    vm = ctx.plan.vms[0]
    workdir = ctx.store.run_dir / "hosts" / vm.name
    workdir.mkdir(parents=True)
    CloudLike.listed = [Instance("cloudlike", "i-earlier", "someone-else", vm.machine.name,
                                 state="running"),
                        Instance("cloudlike", "i-gone", vm.name, vm.machine.name,
                                 state="terminated"),
                        Instance("cloudlike", "i-mine", vm.name, vm.machine.name,
                                 state="RUNNING", address=str(workdir))]
    host = session(ctx)
    host.bring_up()
    assert CloudLike.requests == []
    assert host.inst is not None and host.inst.id == "i-mine"
    assert vm_record(ctx)["state"] == "reattached"


def test_a_new_sweep_never_looks_for_a_vm_to_reattach(tmp_path: Path) -> None:
    ctx = sweep_context(tmp_path, CloudLike)
    vm = ctx.plan.vms[0]
    CloudLike.listed = [Instance("cloudlike", "i-other", vm.name, vm.machine.name,
                                 state="running")]
    host = session(ctx)
    host.bring_up()
    assert len(CloudLike.requests) == 1 and host.inst is not None
    assert host.inst.id == vm.name


def test_a_failed_deletion_is_retried_then_recorded_as_deleted(tmp_path: Path) -> None:
    ctx = sweep_context(tmp_path, CloudLike)
    host = session(ctx)
    host.bring_up()
    CloudLike.failing_deletes = 2
    host.release()
    host.release()  # a second release (Ctrl-C, then the thread's finally) deletes nothing
    assert CloudLike.deletes == [host.vm.name] * 3
    assert host.deleted and host.delete_error is None
    assert vm_record(ctx)["state"] == "deleted"
    assert logged(ctx).count("retrying in 0 s") == 2


def test_a_vm_that_cannot_be_deleted_is_recorded_and_kept_for_the_report(
        tmp_path: Path) -> None:
    ctx = sweep_context(tmp_path, CloudLike)
    host = session(ctx)
    host.bring_up()
    CloudLike.failing_deletes = DELETE_ATTEMPTS
    host.release()
    assert len(CloudLike.deletes) == DELETE_ATTEMPTS
    assert not host.deleted and host.delete_error == "the cloud said no (injected)"
    record = vm_record(ctx)
    assert record["state"] == "delete_failed" and record["error"] == host.delete_error
    assert f"after {DELETE_ATTEMPTS} attempts" in logged(ctx)


def test_a_vm_the_cloud_no_longer_lists_is_preempted(tmp_path: Path) -> None:
    ctx = sweep_context(tmp_path, CloudLike)
    host = session(ctx)
    host.bring_up()
    assert host.inst is not None
    CloudLike.listed = [Instance("cloudlike", host.inst.id, host.inst.name, "m",
                                 state="running")]
    host.check_alive()  # still there: nothing raised
    CloudLike.listed = [Instance("cloudlike", host.inst.id, host.inst.name, "m",
                                 state="STOPPING")]
    with pytest.raises(Preempted, match="is STOPPING"):
        host.check_alive()
    CloudLike.listed = []
    with pytest.raises(Preempted, match="is gone"):
        host.check_alive()


def test_inputs_are_copied_over_the_executor_and_a_shared_hosts_manifests_removed(
        tmp_path: Path) -> None:
    ctx0 = sweep_context(tmp_path, LocalProvider)
    src = tmp_path / "inputs"
    (src / "sub").mkdir(parents=True)
    (src / "a.bin").write_bytes(b"a" * 10)
    (src / "sub" / "b.bin").write_bytes(b"b" * 3)
    inputs = StagedInputs("0123abcd", [("a.bin", 10), ("sub/b.bin", 3)], local_dir=src)
    ctx = SweepContext.create(ctx0.spec, ctx0.plan, ctx0.store, None, inputs, ctx0.progress,
                              ctx0.providers, ctx0.staging)
    host = HostSession(ctx, ctx.plan.vms[0], ctx.providers["local"])
    host.bring_up()
    host.connect()
    host.stage_inputs()
    assert host.inputs_dir is not None
    staged = Path(host.inputs_dir)
    assert (staged / "a.bin").read_bytes() == b"a" * 10
    assert (staged / "sub" / "b.bin").read_bytes() == b"b" * 3
    manifest = Path(host.put_manifest([{"url": "https://signed.example"}], "x.json"))
    assert json.loads(manifest.read_text()) == [{"url": "https://signed.example"}]
    host.release()  # a host that outlives the sweep keeps no signed URL
    assert not manifest.exists() and host.manifests == []
    assert vm_record(ctx)["state"] == "released"
