"""The ``ssh`` provider: machines the user already has, reached over SSH.

Nothing is created or deleted, so nothing can leak: ``create`` hands back the
host as an Instance and ``delete`` only closes the connection. The machine's
size is read from the host itself (``nproc``, ``/proc/meminfo``) rather than
trusted from a file, and its price is whatever the hosts file says (or none —
reports then show no cost rather than a made-up one).

Hosts come from a TOML file (``--hosts FILE``) or ``--host user@addr[:port]``.
The file's schema (docs/tutorials/ssh-hosts.md)::

    [[hosts]]
    name = "bigbox"                 # what --machine and the reports call it (default: address)
    address = "10.0.0.5"            # required: IP or DNS name
    port = 22
    user = "alice"                  # default: the local user name
    key_file = "~/.ssh/id_ed25519"  # default: --ssh-key / $CLOUDPROF_SSH_KEY / ssh-agent
    price_per_hour = 1.20           # USD, optional
    known_host_key = "ssh-ed25519 AAAA..."  # optional; else ~/.ssh/known_hosts
    python = "/usr/bin/python3"     # optional; interpreter the bootstrap venv is built from
    machine = "pair"                # optional; hosts sharing it are the nodes of one machine

Hosts that share ``machine`` form one machine type of that name: ``--machine pair
--nodes 1,2`` runs on the group's first host, then on its first two (node i is the
i-th host of the group in file order), each a node of one Ray cluster. Such a
group is the only way to give a machine several nodes over SSH: the nodes of a
scale-out trial must be separate hosts, or its figures measure one host's cores
shared between Ray nodes. A group's hosts must have the same price (a machine
type has one); that they have the same cores is checked on the hosts themselves
(:meth:`SshProvider.check_nodes_alike`) before a multi-node sweep starts.

Host keys are always verified: the file's ``known_host_key``, else the user's
``~/.ssh/known_hosts``. An unknown host is refused with a one-line error that
says how to add it — never accepted blindly.
"""

from __future__ import annotations

import getpass
import os
import re
import sys
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator import settings
from orchestrator.catalog.machines import MachineType, check_name
from orchestrator.errors import UsageError
from orchestrator.providers.base import Executor, Instance, Provider, ProviderOptions, VmRequest

if TYPE_CHECKING:
    from orchestrator.providers.remote import SshExecutor

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

HOST_KEYS = {
    "name",
    "address",
    "port",
    "user",
    "key_file",
    "price_per_hour",
    "known_host_key",
    "python",
    "machine",
}
_ADDRESS_RE = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][A-Za-z0-9.-]*|[0-9A-Fa-f:]+)$")
# a login name; spec.environment checks CLOUDPROF_SSH_USER by it too
LOGIN_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}$")
_SPEC_RE = re.compile(r"^(?:([^@\s]+)@)?(\[[^\]]+\]|[^:@\s]+)(?::(\d+))?$")

# A host that is up but refuses or drops the connection is misconfigured, not
# booting: give up on it after this long instead of the cloud VMs' minutes.
CONNECT_TIMEOUT_S = 20.0


@dataclass
class SshHost:
    """One machine of the user's, as the hosts file or --host describes it."""

    name: str
    address: str
    port: int = 22
    user: str | None = None
    key_file: Path | None = None
    price_per_hour: float | None = None
    known_host_key: str | None = None
    python: str | None = None
    machine: str | None = None  # the group whose node it is (hosts file ``machine``)


def _name_from_address(address: str, port: int) -> str:
    base = re.sub(r"[^A-Za-z0-9._-]+", "-", address).strip("-._") or "host"
    return base if port == 22 else f"{base}-{port}"


def _check_label(value: object, where: str, key: str, what: str) -> str:
    """A name the reports and ``--machine`` use (a host's, a group's): a string that
    ``check_name`` accepts."""
    if not isinstance(value, str):
        raise UsageError(f"{where}: {key} must be a string")
    try:
        check_name(value, what)
    except UsageError as exc:
        raise UsageError(f"{where}: {exc}") from None
    return value


def _check_address(address: str, where: str) -> str:
    if not _ADDRESS_RE.match(address):
        raise UsageError(f"{where}: invalid address {address!r}")
    return address.strip("[]")


def _check_port(port: object, where: str) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise UsageError(f"{where}: port must be an integer 1-65535, got {port!r}")
    return port


def _check_user(user: object, where: str) -> str:
    if not isinstance(user, str) or not LOGIN_RE.match(user):
        raise UsageError(f"{where}: invalid user {user!r}")
    return user


def parse_host_spec(text: str) -> SshHost:
    """``user@addr[:port]`` (``--host``) as an SshHost named after the address."""
    m = _SPEC_RE.match(text.strip())
    if not m:
        raise UsageError(f"invalid --host {text!r}: use user@address[:port]")
    user, address, port = m.group(1), m.group(2), m.group(3)
    where = f"--host {text!r}"
    address = _check_address(address, where)
    port_no = _check_port(int(port), where) if port else 22
    return SshHost(
        name=_name_from_address(address, port_no),
        address=address,
        port=port_no,
        user=_check_user(user, where) if user else None,
    )


def load_hosts_file(path: Path) -> list[SshHost]:
    """Hosts of a TOML hosts file, validated; every problem is one line naming the file."""
    from orchestrator.providers.remote import PUBLIC_KEY_RE, host_key_from_line

    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise UsageError(f"cannot read hosts file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"hosts file {path} is not valid TOML: {exc}") from None
    extra = set(data) - {"hosts"}
    if extra:
        raise UsageError(f"hosts file {path}: unknown key(s) {', '.join(sorted(extra))}")
    entries = data.get("hosts")
    if not isinstance(entries, list) or not entries:
        raise UsageError(f"hosts file {path}: no [[hosts]] entries")
    hosts: list[SshHost] = []
    for i, entry in enumerate(entries, 1):
        where = f"hosts file {path}, host #{i}"
        if not isinstance(entry, dict):
            raise UsageError(f"{where}: expected a [[hosts]] table")
        unknown = set(entry) - HOST_KEYS
        if unknown:
            raise UsageError(
                f"{where}: unknown key(s) {', '.join(sorted(unknown))}; "
                f"allowed: {', '.join(sorted(HOST_KEYS))}"
            )
        address = entry.get("address")
        if not isinstance(address, str) or not address:
            raise UsageError(f"{where}: address is required")
        address = _check_address(address, where)
        port = _check_port(entry.get("port", 22), where)
        name = _check_label(entry.get("name", _name_from_address(address, port)), where,
                            "name", "host name")
        user = _check_user(entry["user"], where) if "user" in entry else None
        key_file = entry.get("key_file")
        if key_file is not None:
            if not isinstance(key_file, str) or not key_file:
                raise UsageError(f"{where}: key_file must be a path")
            key_path = Path(key_file).expanduser()
            key_file = key_path if key_path.is_absolute() else Path(path).parent / key_path
        price = entry.get("price_per_hour")
        if price is not None and (
            isinstance(price, bool) or not isinstance(price, (int, float)) or price < 0
        ):
            raise UsageError(f"{where}: price_per_hour must be a number >= 0, got {price!r}")
        known = entry.get("known_host_key")
        if known is not None:
            if not isinstance(known, str) or not PUBLIC_KEY_RE.match(known):
                raise UsageError(f"{where}: known_host_key must be one OpenSSH public key line")
            try:
                host_key_from_line(known)  # the key data itself must parse, not just look right
            except UsageError as exc:
                raise UsageError(f"{where}: known_host_key: {exc}") from None
        python = entry.get("python")
        if python is not None and (not isinstance(python, str) or not python):
            raise UsageError(f"{where}: python must be a path")
        machine = entry.get("machine")
        if machine is not None:
            machine = _check_label(machine, where, "machine", "machine name")
        hosts.append(
            SshHost(
                name=name,
                address=address,
                port=port,
                user=user,
                key_file=key_file,
                price_per_hour=float(price) if price is not None else None,
                known_host_key=known,
                python=python,
                machine=machine,
            )
        )
    return hosts


class SshProvider(Provider):
    """The user's own machines; cloudprof only logs in, runs trials and copies files."""

    name = "ssh"
    creates_machines = False

    def __init__(self, options: ProviderOptions) -> None:
        self.options = options
        hosts: list[SshHost] = []
        if options.hosts_file is not None:
            hosts.extend(load_hosts_file(options.hosts_file))
        hosts.extend(parse_host_spec(text) for text in options.hosts)
        self.hosts: dict[str, SshHost] = {}
        for host in hosts:
            if host.name in self.hosts:
                raise UsageError(f"SSH host name {host.name!r} is given twice")
            self.hosts[host.name] = host
        # machine name -> the hosts that are its nodes, node 0 first (hosts file order)
        self.groups: dict[str, list[SshHost]] = {}
        for host in hosts:
            if host.machine is not None:
                self.groups.setdefault(host.machine, []).append(host)
        for name, members in self.groups.items():
            if name in self.hosts:  # --machine NAME would mean two things
                raise UsageError(f"hosts file: machine {name!r} is also the name of a host; "
                                 "rename one of them")
            prices = sorted({str(h.price_per_hour) for h in members})
            if len(prices) > 1:  # the planner prices every node at the machine's one price
                raise UsageError(f"hosts file: the hosts of machine {name!r} differ in "
                                 f"price_per_hour ({', '.join(prices)}); give them one price")
        self._executors: dict[str, SshExecutor] = {}  # one open connection per host

    def machines(self) -> list[str]:
        """What ``--machine`` selects from, in the order given: each host outside a group
        by its name, each group by its ``machine`` name (its hosts are its nodes)."""
        return list(dict.fromkeys(h.machine or h.name for h in self.hosts.values()))

    def host(self, name: str) -> SshHost:
        """A host by its own name (a group's hosts too: the executors are per host)."""
        if name not in self.hosts:
            known = ", ".join(self.machines()) or ("none: give --hosts FILE or --host "
                                                   "user@addr[:port]")
            raise UsageError(f"unknown SSH host {name!r}; hosts: {known}")
        return self.hosts[name]

    def machine_hosts(self, machine: str) -> list[SshHost]:
        """The hosts of ``machine``, node 0 first: a group's, or the one host of that name."""
        if machine in self.groups:
            return self.groups[machine]
        host = self.host(machine)
        if host.machine is not None:  # one node alone would run beside its group's sweeps
            raise UsageError(f"SSH host {machine!r} is a node of machine {host.machine!r} "
                             f"(hosts file): use --machine {host.machine}")
        return [host]

    def check_node_count(self, machine: str, nodes: int) -> None:
        """Refuse ``--nodes`` above the machine's hosts (spec time: no login needed)."""
        hosts = self.machine_hosts(machine)
        if nodes <= len(hosts):
            return
        if machine in self.groups:
            raise UsageError(f"--nodes {nodes}: machine {machine!r} has {len(hosts)} SSH "
                             f"host(s) in the hosts file; add hosts to it or lower --nodes")
        raise UsageError(f"--nodes {nodes}: {machine!r} is one SSH host and a machine's nodes "
                         f"are separate hosts: give {nodes} hosts the same machine = \"NAME\" "
                         "in the hosts file")

    def check_nodes(self, machine: str, nodes: int) -> list[str]:
        """Read cores and memory of the machine's first ``nodes`` hosts (a login each) and
        refuse hosts that differ in cores; the warnings to print (memory apart)."""
        self.check_node_count(machine, nodes)
        hosts = self.machine_hosts(machine)[:nodes]
        facts: dict[str, dict[str, object]] = {}
        try:
            for host in hosts:
                inst = self._instance(host, machine, {})
                facts[host.name] = self._open(inst, CONNECT_TIMEOUT_S).host_facts()
        finally:
            for executor in self._executors.values():
                executor.close()
            self._executors.clear()
        return nodes_alike(machine, facts)

    def machine_type(self, name: str) -> MachineType:
        """A catalog-style row for a host (or a group: one node's): its price from the hosts
        file, size unknown (0) until ``wait_ready`` reads it from the host — for the
        planner's cost estimate."""
        host = self.machine_hosts(name)[0]
        return MachineType(
            provider=self.name,
            name=name,
            family="",
            vcpus=0,
            memory_gib=0.0,
            region="",
            price_on_demand=host.price_per_hour,
            price_spot=None,
            price_source="hosts file" if host.price_per_hour is not None else "",
            price_date=date.today().isoformat() if host.price_per_hour is not None else "",
        )

    def _key_file(self, host: SshHost) -> Path | None:
        if host.key_file is not None:
            return host.key_file
        if self.options.ssh_key is not None:
            return Path(self.options.ssh_key).expanduser()
        env = settings.SSH_KEY.get()
        return Path(env).expanduser() if env else None

    def check_credentials(self) -> None:
        """SSH hosts need no cloud credentials; only the key files must be readable."""
        if not self.hosts:
            raise UsageError(
                "the ssh provider needs hosts: --hosts FILE or --host user@addr[:port]"
            )
        for host in self.hosts.values():
            key = self._key_file(host)
            if key is not None and not os.access(key, os.R_OK):
                raise UsageError(f"SSH key {key} of host {host.name} is not readable")

    def create(self, req: VmRequest) -> Instance:
        """Node ``req.node`` of the machine: the i-th host of its group (a lone host is
        node 0 only)."""
        hosts = self.machine_hosts(req.machine)
        if req.node >= len(hosts):
            self.check_node_count(req.machine, req.node + 1)
        return self._instance(hosts[req.node], req.machine, req.labels)

    def _instance(self, host: SshHost, machine: str, labels: dict[str, str]) -> Instance:
        return Instance(
            provider=self.name,
            id=host.name,
            name=host.name,
            machine=machine,
            state="running",
            address=host.address,
            port=host.port,
            user=host.user or getpass.getuser(),
            labels=dict(labels),
            facts={"price_per_hour": host.price_per_hour},
        )

    def _open(self, inst: Instance, timeout: float) -> SshExecutor:
        from orchestrator.providers.remote import SshTarget, open_ssh

        cached = self._executors.get(inst.id)
        if cached is not None and cached.is_connected():
            return cached
        host = self.host(inst.id)
        target = SshTarget(
            host=host.address,
            port=host.port,
            user=inst.user or host.user or getpass.getuser(),
            key_file=self._key_file(host),
            known_keys=[host.known_host_key] if host.known_host_key else [],
            booting=False,
            python=host.python,
        )
        executor = open_ssh(target, min(timeout, CONNECT_TIMEOUT_S))
        self._executors[inst.id] = executor
        return executor

    def wait_ready(self, inst: Instance, timeout: float = 600) -> Instance:
        """Log in once and read the host's size (vcpus, memory_gib) into ``inst.facts``."""
        executor = self._open(inst, timeout)
        inst.facts.update(executor.host_facts())
        inst.facts.setdefault("price_per_hour", self.host(inst.id).price_per_hour)
        return inst

    def connect(self, inst: Instance) -> Executor:
        return self._open(inst, CONNECT_TIMEOUT_S)

    def delete(self, inst: Instance) -> None:
        """Nothing to delete on a user's host; close the connection."""
        executor = self._executors.pop(inst.id, None)
        if executor is not None:
            executor.close()

    def list(self, labels: dict[str, str]) -> list[Instance]:
        return []  # cloudprof never creates anything on SSH hosts


MEMORY_SPREAD = 0.10  # alike hosts' MemTotal differs by kernel and firmware reservations


def nodes_alike(machine: str, facts: dict[str, dict[str, object]]) -> list[str]:
    """Whether hosts (name -> host_facts) can be the nodes of one machine.

    Different cores are refused (UsageError): every node runs the same worker count,
    and the machine has one vCPU count in the reports, so a smaller node would be a
    straggler that the scale-out figures blame on the machine. Memory more than 10 %
    apart is only a warning (returned): it does not change the throughput of a
    workload that fits, and the per-node peaks are reported node by node.
    """
    cores = {name: f.get("vcpus") for name, f in facts.items()}
    if len(set(cores.values())) > 1:
        listing = ", ".join(f"{name} {n}" for name, n in cores.items())
        raise UsageError(f"the hosts of machine {machine!r} differ in cores ({listing} vCPUs): "
                         "a machine's nodes must be alike; group alike hosts")
    memory = {name: float(f.get("memory_gib") or 0.0) for name, f in facts.items()}
    if memory and min(memory.values()) * (1 + MEMORY_SPREAD) < max(memory.values()):
        listing = ", ".join(f"{name} {gib:g}" for name, gib in memory.items())
        return [f"the hosts of machine {machine!r} differ in memory ({listing} GiB); "
                "its per-node peaks show each host's"]
    return []
