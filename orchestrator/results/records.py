"""What sweep.json holds of each VM: a typed record, written field by field as it is known.

``RunStore.record_vm`` merges these fields into ``sweep.json``'s ``vms[<name>]`` the
moment the engine learns them (the id first: ``cleanup`` needs it if the laptop dies
next), and refuses a field this record does not declare, so what a reader of
sweep.json may find is written down here, once.
"""

from __future__ import annotations

from typing import Any, TypedDict


class VmRecord(TypedDict, total=False):
    """One VM (or SSH host) of a sweep, as sweep.json has it."""

    provider: str  # gcp | aws | ssh | local
    machine: str  # the machine type (or ssh host group) it was planned as
    spot: bool
    price_per_hour: float | None  # USD, the catalog's at launch
    labels: dict[str, str]  # cloudprof's labels on the resource (sweep id, expiry)
    requested_at: str  # ISO 8601 UTC
    id: str  # the provider's instance id: known before anything else is done
    zone: str | None
    created_at: str
    state: str  # created | reattached | ready | create_failed | deleted | delete_failed ...
    address: str | None  # where the control plane reaches it
    ready_at: str
    facts: dict[str, Any]  # the host's cores, memory, CPU model, Python
    inputs_staged_at: str
    job: dict[str, Any]  # the user's job copy on the host: its hash and directory
    setup: str  # --setup: ran | reused | failed
    setup_log: str
    setup_done_at: str
    ray: dict[str, Any]  # --nodes: the cluster's head address and nodes
    node_of: str  # --nodes: a worker node's head VM
    adaptive: dict[str, Any]  # --adaptive: trials spent against the grid's
    error: str | None  # one line, when creating, reaching or deleting it failed
    failed_at: str
    deleted_at: str


VM_FIELDS = frozenset(VmRecord.__annotations__)


def check_vm_fields(info: dict[str, Any]) -> None:
    """A field sweep.json's VM record does not declare is a programming error, said now."""
    unknown = sorted(set(info) - VM_FIELDS)
    if unknown:
        raise ValueError(f"not fields of a VmRecord (orchestrator/results/records.py): {unknown}")
