"""The sweep's SSH keys, the VM's first-boot script filled with them, and who may reach SSH."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shlex
import threading
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.atomic import atomic_write_bytes
from orchestrator.errors import ProviderError, UsageError
from orchestrator.packaged import data_path

ENV_KEY = "CLOUDPROF_SSH_KEY"
ENV_HOST_KEY = "CLOUDPROF_SSH_HOST_KEY"

STARTUP_TEMPLATE = "startup.sh"  # infra/startup.sh, packaged (orchestrator.packaged)
# Files the startup script writes; the bootstrap waits for "done" when "started" exists.
STARTUP_STATE_DIR = "/var/lib/cloudprof"

USER_RE = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}$")
PUBLIC_KEY_RE = re.compile(
    r"^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)|sk-[a-z0-9@.-]+)"
    r" [A-Za-z0-9+/]+=*( [^\r\n]*)?$"
)


# --------------------------------------------------------------------------- keys


def _serialization() -> Any:
    from cryptography.hazmat.primitives import serialization

    return serialization


def _write_secret(path: Path, data: bytes) -> None:
    """Create ``path`` with mode 0600 from the start (never briefly world-readable)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    atomic_write_bytes(path, data, mode=0o600)  # its temp file is 0600 from creation too


def _generate_ed25519(path: Path, comment: str) -> str:
    """Write a new OpenSSH-format ed25519 private key to ``path``; return its public line."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    ser = _serialization()
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.OpenSSH, ser.NoEncryption())
    public = key.public_key().public_bytes(ser.Encoding.OpenSSH, ser.PublicFormat.OpenSSH)
    line = f"{public.decode()} {comment}"
    _write_secret(path, private)
    Path(str(path) + ".pub").write_text(line + "\n")
    return line


def public_line(private_key: Path, comment: str = "") -> str:
    """The OpenSSH public line of a private key file (OpenSSH or PEM format, unencrypted)."""
    ser = _serialization()
    try:
        data = Path(private_key).expanduser().read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read SSH key {private_key}: {exc.strerror or exc}") from None
    try:
        if b"BEGIN OPENSSH PRIVATE KEY" in data:
            key = ser.load_ssh_private_key(data, password=None)
        else:
            key = ser.load_pem_private_key(data, password=None)
    except TypeError:
        raise UsageError(
            f"SSH key {private_key} is encrypted: use an unencrypted key for cloudprof "
            "(or let it generate one per sweep)"
        ) from None
    except ValueError as exc:
        raise UsageError(f"{private_key} is not a usable SSH private key: {exc}") from None
    public = key.public_key().public_bytes(ser.Encoding.OpenSSH, ser.PublicFormat.OpenSSH)
    return f"{public.decode()} {comment}".strip()


@dataclass
class SshKeys:
    """The sweep's SSH identity: the client key cloudprof logs in with and the VM's host key.

    ``generated`` lists the files cloudprof made (deleted by ``remove``); keys
    given by the user (``--ssh-key``, ``CLOUDPROF_SSH_KEY``, ``CLOUDPROF_SSH_HOST_KEY``)
    are never deleted.
    """

    user_key: Path  # client private key
    user_public: str  # its OpenSSH public line (installed in authorized_keys on the VM)
    host_key: Path  # host private key (installed on the VM by the startup script)
    host_public: str  # its public line (what cloudprof expects the VM to present)
    generated: list[Path] = field(default_factory=list)
    # Set by the sweep engine when it stops (Ctrl-C): connect() stops waiting for SSH.
    cancel: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)

    @classmethod
    def for_sweep(cls, sweep_dir: Path, override_key: Path | None = None) -> SshKeys:
        """Keys of the sweep in ``sweep_dir/keys/``, generated on first use, reused on resume.

        ``override_key`` (``--ssh-key``) or ``$CLOUDPROF_SSH_KEY`` replaces the
        client key; ``$CLOUDPROF_SSH_HOST_KEY`` replaces the host key.
        """
        keys_dir = Path(sweep_dir) / "keys"
        generated: list[Path] = []
        tag = f"cloudprof-{Path(sweep_dir).name}"

        def own(name: str, comment: str) -> tuple[Path, str]:
            path = keys_dir / name
            pub = Path(str(path) + ".pub")
            if path.exists() and pub.exists():  # resume: the VMs already trust these
                line = pub.read_text().strip()
            else:
                line = _generate_ed25519(path, comment)
            generated.extend([path, pub])
            return path, line

        client = override_key or (Path(os.environ[ENV_KEY]) if os.environ.get(ENV_KEY) else None)
        if client is not None:
            client = client.expanduser()
            user_key, user_public = client, public_line(client, tag)
        else:
            user_key, user_public = own("client_ed25519", tag)
        host = os.environ.get(ENV_HOST_KEY)
        if host:
            host_key = Path(host).expanduser()
            host_public = public_line(host_key, f"{tag}-host")
        else:
            host_key, host_public = own("host_ed25519", f"{tag}-host")
        return cls(user_key, user_public, host_key, host_public, generated)

    def remove(self) -> None:
        """Delete the keys cloudprof generated (teardown); user-given keys stay."""
        for path in self.generated:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        parents = {p.parent for p in self.generated}
        for parent in parents:
            with contextlib.suppress(OSError):
                parent.rmdir()  # only if empty


# --------------------------------------------------------------------------- startup script


def _check_public_key(line: str, what: str) -> str:
    if not PUBLIC_KEY_RE.match(line):
        raise UsageError(f"{what} is not a one-line OpenSSH public key")
    return line


def startup_script(keys: SshKeys, ssh_user: str, expires_at: int) -> str:
    """``infra/startup.sh`` with the sweep's values filled in, each shell-quoted.

    Run as root at first boot: installs the sweep's host key, authorises the
    client key for ``ssh_user``, and schedules power-off at ``expires_at``
    (unix time) — the provider deletes the VM on shutdown, so it dies even if
    the laptop running the sweep does.
    """
    if not USER_RE.match(ssh_user):
        raise UsageError(f"invalid SSH user name {ssh_user!r}")
    template_path = data_path(STARTUP_TEMPLATE)
    try:
        template = template_path.read_text()
        host_private = Path(keys.host_key).read_text().strip()
    except OSError as exc:
        raise UsageError(f"cannot read {exc.filename}: {exc.strerror}") from None
    values = {
        "SSH_USER": ssh_user,
        "CLIENT_PUBLIC_KEY": _check_public_key(keys.user_public, "client public key"),
        "HOST_PRIVATE_KEY": host_private,
        "HOST_PUBLIC_KEY": _check_public_key(keys.host_public, "host public key"),
        "EXPIRES_AT": str(int(expires_at)),
        "STATE_DIR": STARTUP_STATE_DIR,
    }

    def fill(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in values:
            raise UsageError(f"{template_path}: unknown placeholder @{name}@")
        return shlex.quote(values[name])

    # One pass, so a value that looks like a placeholder is never substituted again.
    return re.sub(r"@([A-Z_]+)@", fill, template)



SOURCE_CIDR_ENV = "CLOUDPROF_SSH_SOURCE_CIDR"  # who may reach port 22 of a sweep's VMs


def caller_cidr() -> str:
    """Where SSH may come from: ``CLOUDPROF_SSH_SOURCE_CIDR``, else this machine's public IP."""
    cidr = os.environ.get(SOURCE_CIDR_ENV)
    if cidr:
        try:
            network = ipaddress.ip_network(cidr.strip(), strict=False)
        except ValueError:
            raise UsageError(f"{SOURCE_CIDR_ENV}={cidr!r} is not an address range "
                             "like 203.0.113.7/32") from None
        if network.prefixlen == 0:
            raise UsageError(f"{SOURCE_CIDR_ENV}={cidr} would admit the whole internet to SSH")
        return str(network)
    for url in ("https://checkip.amazonaws.com", "https://api.ipify.org"):
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                addr = ipaddress.ip_address(resp.read().decode().strip())
            return f"{addr}/{addr.max_prefixlen}"
        except (OSError, ValueError):
            continue
    raise ProviderError("could not discover your public IP address for the SSH firewall rule; "
                        f"set {SOURCE_CIDR_ENV}=a.b.c.d/32")
