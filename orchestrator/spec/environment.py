"""The ``CLOUDPROF_*`` settings a sweep reads (``orchestrator.settings``), checked up front.

Each setting is read deep inside a provider or the engine — the SSH user when the
first VM is reached, the AMI when the first one is created — so a bad value used to
surface after credentials were checked, a run directory made and a VM paid for (a
user ``root;id`` waited out the 300 s boot timeout), and then suggested a resume
that could not help. Spec validation calls :func:`check_environment` first; each
check is the reader's own parser where it has one, so the two cannot disagree.
Only settings that are set are checked: an unset one keeps its default.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path

from orchestrator import settings
from orchestrator.errors import UsageError

_PYTHON_RE = re.compile(r"^[A-Za-z0-9_./+~-]+$")  # a path or a command name, one word
_EMAIL_RE = re.compile(r"^[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}$")
_URL_RE = re.compile(r"^https?://[A-Za-z0-9.\-\[\]:]+(/[^\s]*)?$")
_SWITCH_WORDS = {"0", "1", "no", "yes", "false", "true", "off", "on"}


def _ssh_endpoint(name: str, value: str) -> None:
    from orchestrator.providers.remote import parse_endpoint

    parse_endpoint(value)


def _ssh_user(name: str, value: str) -> None:
    from orchestrator.providers.ssh import LOGIN_RE

    if not LOGIN_RE.match(value):
        raise UsageError(f"{name}={value!r} is not a login name (letters, digits, '_', '.', "
                         "'-'; at most 32)")


def _ssh_key(name: str, value: str) -> None:
    from orchestrator.providers.remote import public_line

    public_line(Path(value).expanduser())  # readable, a private key, not encrypted


def _remote_dir(name: str, value: str) -> None:
    if not value.startswith(("/", "~")) or any(c.isspace() or not c.isprintable()
                                               for c in value):
        raise UsageError(f"{name}={value!r}: give an absolute directory on the host, "
                         "without spaces")


def _python(name: str, value: str) -> None:
    if not _PYTHON_RE.match(value):
        raise UsageError(f"{name}={value!r}: give one Python command or path, e.g. python3")


def _boot_timeout(name: str, value: str) -> None:
    from orchestrator.providers.remote import boot_timeout

    boot_timeout()


def _source_cidr(name: str, value: str) -> None:
    from orchestrator.providers.remote import caller_cidr

    caller_cidr()  # set, so parsed only: nothing is fetched


def _aws_image(name: str, value: str) -> None:
    from orchestrator.catalog.images import AWS_IMAGES as IMAGES

    if re.match(r"^ami-[0-9a-f]{8,17}$", value) or value in IMAGES:
        return
    if re.match(r"^/[A-Za-z0-9_./-]+$", value):  # an SSM parameter path
        return
    raise UsageError(f"{name}={value!r}: use one of {', '.join(IMAGES)}, an SSM parameter "
                     "path (/aws/service/...) or an AMI id (ami-...)")


def _url(name: str, value: str) -> None:
    if not _URL_RE.match(value):
        raise UsageError(f"{name}={value!r} is not an http(s) URL")


def _email(name: str, value: str) -> None:
    if not _EMAIL_RE.match(value):
        raise UsageError(f"{name}={value!r} is not a service account's email")


def _size(name: str, value: str) -> None:
    from orchestrator.spec.job import max_bytes

    max_bytes()


def _seconds(name: str, value: str) -> None:
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not 0 <= seconds <= 600:
        raise UsageError(f"{name}={value!r}: give a number of seconds from 0 to 600")


def _switch(name: str, value: str) -> None:
    if value.lower() not in _SWITCH_WORDS:
        raise UsageError(f"{name}={value!r}: give 1 or 0")


def _directory(name: str, value: str) -> None:
    if not Path(value).expanduser().is_dir():
        raise UsageError(f"{name}={value!r} is not a directory")


def _cache(name: str, value: str) -> None:
    path = Path(value).expanduser()
    if path.exists() and not path.is_dir():
        raise UsageError(f"{name}={value!r} is not a directory")


CHECKS: dict[str, Callable[[str, str], None]] = {
    settings.SSH_ENDPOINT.name: _ssh_endpoint,
    settings.SSH_USER.name: _ssh_user,
    settings.SSH_KEY.name: _ssh_key,
    settings.SSH_HOST_KEY.name: _ssh_key,
    settings.SSH_WORKDIR.name: _remote_dir,
    settings.SSH_PYTHON.name: _python,
    settings.SSH_BOOT_TIMEOUT.name: _boot_timeout,
    settings.SSH_SOURCE_CIDR.name: _source_cidr,
    settings.AWS_IMAGE.name: _aws_image,
    settings.GCE_ENDPOINT.name: _url,
    settings.GCP_BILLING_ENDPOINT.name: _url,
    settings.GCS_SIGNER.name: _email,
    settings.MAX_WORKDIR.name: _size,
    settings.DELETE_BACKOFF_S.name: _seconds,
    settings.WARM_RUNNER.name: _switch,
    settings.CATALOG_DIR.name: _directory,
    settings.CACHE.name: _cache,
    settings.REPORT_BUNDLE_DIR.name: _directory,
}


def check_environment() -> None:
    """Refuse the first set ``CLOUDPROF_*`` setting its reader would reject, in one line
    that names it."""
    for name, check in CHECKS.items():
        value = settings.BY_NAME[name].get()
        if not value:
            continue
        try:
            check(name, value.strip())
        except UsageError as exc:
            message = str(exc)
            raise UsageError(message if name in message else f"{name}: {message}") from None
