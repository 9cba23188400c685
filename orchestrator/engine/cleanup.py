"""``cloudprof cleanup``: the last net under a sweep's teardown.

A sweep deletes its VMs in a ``finally`` and every VM powers itself off at its
expiry time, but a SIGKILLed laptop, a delete call that failed, or a key pair
outliving its instance still leave things behind that cost money or clutter an
account. Everything a sweep makes carries cloudprof's labels (sweep id,
creator, creation and expiry time), so this module finds it with each cloud
provider's own ``list_resources``, picks what is due, shows it, and only with
``--yes`` deletes it with the same provider's ``delete_resources``. It makes no
cloud call of its own: one place per cloud knows how to list and delete.

Bucket prefixes a sweep wrote (``results/<sweep>/``, ``inputs/<hash>/``) carry
the same labels in a marker object (``Bucket.label_prefix``). The buckets looked
in are those given with ``--bucket``, the one of ``--config``'s file, and those
recorded in the run directories below ``--out`` and in the ``--sweep`` run
directory (``store.recorded_buckets``): a bucket that cannot be listed is one
line and skipped, unless it was given with ``--bucket``.

What is due: with ``--sweep``, everything of that sweep; with
``--older-than``, what was created longer ago than that; otherwise what is
past its expiry label, and every cloud resource (instance, key pair, security
group, firewall rule) of a sweep that has ended: one with a run directory under
``--out`` (or the ``--sweep`` one) that no process is running, whatever its
sweep.json says (a SIGKILLed sweep's still says ``running``; the run's lock,
held by the sweep's process, is what tells). A resource of a sweep that a
process here is running is not due by that rule nor by its expiry: the sweep
deletes it itself. A sweep with no run directory here (another computer's, or
one whose directory is gone) is judged by its expiry label alone.

A per-sweep resource (key pair, security group, firewall rule) also goes with
the last instance of its sweep, and never while an instance of its sweep that
is not due still runs (it would still need it).
A bucket prefix stays while an instance of a sweep using it is kept, or while a
sweep using it (other than the ``--sweep`` one) has not expired: the inputs cache
is shared; a sweep having ended does not make its prefixes due (``--resume``
collects results from them), their retention does. Instances are deleted
first, bucket prefixes last; a failure is reported in one line and the rest
still go.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.engine.cleanup_view import (
    count,
    id_and_name,
    repeat_command,
    resource_table,
    say_line,
    selection,
)
from orchestrator.errors import (
    CloudprofError,
    CredentialsError,
    ProviderError,
    UsageError,
    one_line,
)
from orchestrator.plan.planner import slug
from orchestrator.providers import get_provider, open_bucket
from orchestrator.providers.base import LABEL_SWEEP, Bucket, LabelledPrefix, Provider, Resource

if TYPE_CHECKING:
    from rich.console import Console

CLOUDS = ("aws", "gcp")  # providers that create machines, hence leave things behind
INSTANCE = "instance"
BUCKET_CLOUDS = {"gs": "gcp", "s3": "aws"}  # a bucket URL's scheme -> --provider name


@dataclass
class Leftover:
    """One resource and the cloud it lives in (and the bucket, for a bucket prefix)."""

    provider: str
    resource: Resource
    bucket: Bucket | None = None

    @property
    def is_instance(self) -> bool:
        return self.resource.kind == INSTANCE

    @property
    def sweeps(self) -> set[str]:
        """Sweeps the resource belongs to: several for a shared inputs prefix."""
        res = self.resource
        if isinstance(res, LabelledPrefix):
            return {*res.sweeps, *([res.sweep_id] if res.sweep_id else [])}
        return {res.sweep_id} if res.sweep_id else set()

    @property
    def sweep_key(self) -> tuple[str, str | None]:
        return self.provider, self.resource.sweep_id

    def describe(self) -> str:
        res = self.resource
        where = res.zone or res.region or "global"
        return f"{self.provider} {res.kind} {id_and_name(res)} in {where}"


@dataclass
class Buckets:
    """Where cleanup looks for labelled prefixes (module docstring)."""

    given: list[str] = field(default_factory=list)  # --bucket: failing to list one is an error
    found: list[str] = field(default_factory=list)  # config file and run directories

    def argv(self) -> list[str]:
        return [a for url in self.given for a in ("--bucket", url)]


def cleanup(
    provider: str | None,
    older_than_s: float | None,
    sweep_id: str | None,
    yes: bool,
    console: Console,
    given_buckets: Sequence[str] = (),
    found_buckets: Sequence[str] = (),
    runs_dirs: Sequence[Path] = (),
) -> int:
    """List what is due (and delete it with ``yes``); 0 when all went well.

    Labelled prefixes are looked for in ``given_buckets`` (--bucket: one that cannot
    be listed is an error) and ``found_buckets`` (from the config file and run
    directories: skipped with one line). ``runs_dirs`` are run directories, or
    directories of them, whose sweeps are looked at (``sweep_activity``). A failed
    deletion raises ProviderError after every other resource was tried, so the CLI
    exits non-zero with one line.
    """
    now = time.time()
    sweep_label = slug(sweep_id) if sweep_id else None  # the engine labels with slug(id)
    given = list(dict.fromkeys(given_buckets))
    buckets = Buckets(given, [u for u in dict.fromkeys(found_buckets) if u not in given])
    listed, searched, failures = _list_everywhere(provider, sweep_label, console)
    _list_buckets(buckets, provider, sweep_label, console, listed, searched, failures)
    live, ended = sweep_activity(runs_dirs)
    due, kept = choose(listed, now, older_than_s, sweep_label, live=live, ended=ended)
    what = selection(older_than_s, sweep_id, ended)

    if not due:
        if searched:
            say_line(console, f"nothing to clean up: no cloudprof resources {what} "
                           f"in {', '.join(searched)}")
        elif not failures:
            say_line(console, "nothing searched: no cloud is set up here (see above)")
        _say_kept(console, kept)
        if failures:
            raise ProviderError(f"cleanup: {failures[0]}")
        return 0

    console.print(resource_table(due, now, title=f"cloudprof resources {what}"))
    _say_kept(console, kept)
    if not yes:
        say_line(console, f"nothing was deleted. To delete these {count(due)}, run: "
                       f"{repeat_command(provider, older_than_s, sweep_id, buckets)} --yes")
        if failures:
            raise ProviderError(f"cleanup: {failures[0]}")
        return 0

    deleted, failed = delete(due, console)
    say_line(console, f"deleted {deleted} of {count(due)}"
                   + (f"; {len(failed)} failed (above)" if failed else ""))
    failures += failed
    if failures:
        raise ProviderError(
            f"cleanup: {len(failures)} problem(s), first: {failures[0]}; fix the cause and run "
            f"`{repeat_command(provider, older_than_s, sweep_id, buckets)} --yes` again"
        )
    return 0


# ---------------------------------------------------------------- finding


def _list_everywhere(
    provider: str | None, sweep_label: str | None, console: Console
) -> tuple[list[Leftover], list[str], list[str]]:
    """Leftovers in every cloud asked for, the clouds searched, and listing failures.

    Without ``--provider`` a cloud with no credentials (or no project) is one
    line and skipped: most users have only one of them. A cloud named
    explicitly raises instead, as does any error there.
    """
    names = [provider] if provider else list(CLOUDS)
    labels = {LABEL_SWEEP: sweep_label} if sweep_label else None
    listed: list[Leftover] = []
    searched: list[str] = []
    failures: list[str] = []
    for name in names:
        cloud = get_provider(name)
        try:
            cloud.check_credentials()
        except (CredentialsError, UsageError) as exc:
            if provider is not None:
                raise
            say_line(console, f"{name}: skipped, not set up here ({exc})")
            continue
        try:
            found = cloud.list_resources(labels)
        except CloudprofError as exc:
            if provider is not None:
                raise
            say_line(console, f"{name}: listing failed: {exc}")
            failures.append(f"{name}: listing failed: {exc}")
            continue
        searched.append(name)
        listed.extend(Leftover(name, res) for res in found)
    return listed, searched, failures


def _list_buckets(buckets: Buckets, provider: str | None, sweep_label: str | None,
                  console: Console, listed: list[Leftover], searched: list[str],
                  failures: list[str]) -> None:
    """Add the labelled prefixes of each bucket (of ``provider``'s cloud, if given)."""
    for url in [*buckets.given, *buckets.found]:
        cloud = BUCKET_CLOUDS.get(url.partition("://")[0] if "://" in url else "", "local")
        if provider is not None and cloud != provider:
            continue
        try:
            if cloud == "local" and not _local_dir(url).is_dir():
                if url not in buckets.given:
                    continue  # a dry run's bucket directory that is gone: nothing left in it
                raise FileNotFoundError("no such directory")  # not made by opening it
            bucket = open_bucket(url)
            prefixes = bucket.labelled_prefixes()
        except (CloudprofError, OSError) as exc:
            message = f"bucket {url}: cannot list it: {one_line(exc)}"
            if url in buckets.given:
                say_line(console, message)
                failures.append(message)
            else:
                say_line(console, f"{message}; skipped")
            continue
        searched.append(bucket.url)
        listed.extend(Leftover(cloud, p, bucket) for p in prefixes
                      if sweep_label is None or sweep_label in Leftover(cloud, p).sweeps)


def _local_dir(url: str) -> Path:
    from urllib.parse import unquote, urlparse

    return Path(unquote(urlparse(url).path) if url.startswith("file://") else url).expanduser()



def sweep_activity(paths: Iterable[Path]) -> tuple[set[str], set[str]]:
    """The sweeps (by label: the slug of their id) of the run directories at ``paths``
    that a process is running now, and those that ended (module docstring).

    A path is a run directory or a directory of them; one that cannot be read is no
    run. A sweep id found in several directories is running if any of them is.
    """
    import json

    from orchestrator.results.store import SWEEP_FILE, run_in_progress

    live: set[str] = set()
    seen: set[str] = set()
    for path in map(Path, paths):
        runs = [path] if (path / SWEEP_FILE).is_file() else sorted(path.glob("*"))
        for run_dir in runs:
            try:
                sweep = json.loads((run_dir / SWEEP_FILE).read_text(encoding="utf-8"))
                label = slug(str(sweep["sweep_id"]))
            except (OSError, ValueError, TypeError, KeyError):
                continue
            if not label:
                continue
            seen.add(label)
            if run_in_progress(run_dir):
                live.add(label)
    return live, seen - live


def choose(
    listed: Iterable[Leftover],
    now: float,
    older_than_s: float | None = None,
    sweep_label: str | None = None,
    *,
    live: set[str] | frozenset[str] = frozenset(),
    ended: set[str] | frozenset[str] = frozenset(),
) -> tuple[list[Leftover], list[Leftover]]:
    """Split ``listed`` into what is due for deletion and what is kept (module docstring).

    ``live`` and ``ended`` (from ``sweep_activity``) are used without ``--sweep`` and
    ``--older-than`` only, and for cloud resources only, never for bucket prefixes.
    """

    def due_alone(item: Leftover) -> bool:
        res = item.resource
        if sweep_label is not None and sweep_label not in item.sweeps:
            return False
        if older_than_s is not None:
            created = res.created_at
            return created is not None and now - created >= older_than_s
        if sweep_label is not None:
            return True
        if item.bucket is None and res.sweep_id in live:
            return False  # its sweep is running here: the sweep deletes it
        if item.bucket is None and res.sweep_id in ended:
            return True
        expires = res.expires_at
        return expires is not None and expires <= now

    items = list(listed)
    instances_due = {id(i) for i in items if i.is_instance and due_alone(i)}
    running = {i.sweep_key for i in items if i.is_instance and id(i) not in instances_due}
    going = {i.sweep_key for i in items if id(i) in instances_due}
    running_sweeps = {sweep for _, sweep in running}
    due: list[Leftover] = []
    kept: list[Leftover] = []
    for item in items:
        if item.is_instance:
            is_due = id(item) in instances_due
        elif item.bucket is not None:  # a bucket prefix: never under a live user
            is_due = (due_alone(item) and not item.sweeps & running_sweeps
                      and not _in_use(item, now, sweep_label))
        else:
            is_due = (due_alone(item) or item.sweep_key in going) and item.sweep_key not in running
        (due if is_due else kept).append(item)
    return _ordered(due), _ordered(kept)


def _in_use(item: Leftover, now: float, sweep_label: str | None) -> bool:
    """A bucket prefix still used by a sweep that has not expired (other than --sweep's)."""
    res = item.resource
    return isinstance(res, LabelledPrefix) and bool(res.users_alive(now, besides=sweep_label))


def _ordered(items: list[Leftover]) -> list[Leftover]:
    """Per cloud and sweep, instances first: the order they are shown and deleted in."""
    return sorted(items, key=lambda i: (i.provider, i.resource.sweep_id or "",
                                        not i.is_instance, i.resource.kind, i.resource.id))


# ---------------------------------------------------------------- deleting


def delete(due: list[Leftover], console: Console) -> tuple[int, list[str]]:
    """Delete ``due``: each cloud's instances first, then the per-sweep resources.

    Instances go in one call per cloud (its provider terminates them together and
    waits once); if that call fails they are retried one by one, so the line
    says which one failed. A per-sweep resource whose sweep still has an
    instance that could not be deleted is left (it is still in use).
    """
    deleted = 0
    failures: list[str] = []
    prefixes = [i for i in due if i.bucket is not None]
    for name in sorted({i.provider for i in due if i.bucket is None}):
        cloud = get_provider(name)
        mine = [i for i in due if i.provider == name and i.bucket is None]
        instances = [i for i in mine if i.is_instance]
        stuck: set[tuple[str, str | None]] = set()
        if instances:
            try:
                cloud.delete_resources([i.resource for i in instances])
                for item in instances:
                    say_line(console, f"deleted {item.describe()}")
                deleted += len(instances)
            except CloudprofError:
                for item in instances:
                    if _delete_one(cloud, item, console, failures):
                        deleted += 1
                    else:
                        stuck.add(item.sweep_key)
        for item in mine:
            if item.is_instance:
                continue
            if item.sweep_key in stuck:
                message = (f"kept {item.describe()}: an instance of sweep "
                           f"{item.resource.sweep_id} could not be deleted")
                say_line(console, message)
                failures.append(message)
            elif _delete_one(cloud, item, console, failures):
                deleted += 1
    for item in prefixes:  # after the instances that could still write to them
        if _delete_one(None, item, console, failures):
            deleted += 1
    return deleted, failures


def _delete_one(cloud: Provider | None, item: Leftover, console: Console,
                failures: list[str]) -> bool:
    """Delete one resource (a bucket prefix through its bucket); a failure is one line."""
    try:
        if item.bucket is not None:
            current = item.bucket.prefix_labels(item.resource.id)
            if current is not None and current.labels != item.resource.labels:
                # A sweep started using the prefix (the inputs cache) since it was listed.
                say_line(console, f"kept {item.describe()}: a sweep relabelled it just now")
                return False
            count = item.bucket.delete_labelled(item.resource.id)
            done = f" ({count} object{'' if count == 1 else 's'})"
        else:
            assert cloud is not None
            cloud.delete_resources([item.resource])
            done = ""
    except (CloudprofError, OSError) as exc:
        message = f"could not delete {item.describe()}: {one_line(exc)}"
        say_line(console, message)
        failures.append(message)
        return False
    say_line(console, f"deleted {item.describe()}{done}")
    return True


# ---------------------------------------------------------------- showing


def _say_kept(console: Console, kept: list[Leftover]) -> None:
    """Why other cloudprof resources stay, so an empty table is never a mystery."""
    if not kept:
        return
    running = {i.sweep_key for i in kept if i.is_instance}
    in_use = [i for i in kept if not i.is_instance and i.bucket is None and i.sweep_key in running]
    running_sweeps = {sweep for _, sweep in running}
    now = time.time()
    prefixes_in_use = [i for i in kept if i.bucket is not None
                       and (i.sweeps & running_sweeps or _in_use(i, now, None))]
    note = f"left alone: {count(kept)} not due"
    if in_use:
        note += f" ({len(in_use)} still used by an instance of their sweep that is not due)"
    if prefixes_in_use:
        note += (f" ({len(prefixes_in_use)} bucket prefix(es) still used by a sweep that "
                 "has not expired)")
    say_line(console, note + "; --sweep ID or --older-than DURATION selects them")
