"""From command-line values and an optional ``sweep.toml`` to a validated SweepSpec.

Every sweep option (``spec/options.py``) can be written in the TOML file under
its key (dashes or underscores, or an alias); a flag given on the command line
overrides the file. Each value goes through its option's converter
(``spec/values.py``), then ``spec/validate.py`` checks the options together, so a
bad spec fails in a second with one line, before anything is provisioned or
paid for. Paths in the file are relative to the file's directory.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from orchestrator.catalog.machines import suggest
from orchestrator.errors import UsageError
from orchestrator.spec.options import (
    ALIASES,
    BY_KEY,
    CONFIG_KEYS,
    PATH_KEYS,
    WORKLOAD_PARAM_KEYS,
    convert,
    flag_name,
)
from orchestrator.spec.spec import SweepSpec
from orchestrator.spec.validate import validate_spec
from orchestrator.spec.values import SECRET_VALUE_RE

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

MAX_CONFIG_BYTES = 1 << 20  # a sweep.toml is a few dozen lines


def read_config(path: Path) -> dict[str, Any]:
    """The options of a ``sweep.toml``, converted; paths made relative to its directory.

    Only a regular file is read: a FIFO or a terminal would block the read forever, a
    device never end it."""
    import stat

    try:
        st = path.stat()
    except OSError as exc:
        raise UsageError(f"--config: cannot read {str(path)!r}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "a pipe, device or socket"
        raise UsageError(f"--config: {str(path)!r} is {kind}, not a sweep.toml file")
    if st.st_size > MAX_CONFIG_BYTES:
        raise UsageError(f"--config: {str(path)!r} is {st.st_size:,} bytes; a sweep.toml "
                         f"is at most {MAX_CONFIG_BYTES:,}")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"--config: cannot read {str(path)!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise UsageError(f"--config: {str(path)!r} is not UTF-8 text") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: invalid TOML: {exc}") from None
    except RecursionError:  # tomllib recurses once per level of nesting
        raise UsageError(f"{path}: invalid TOML: nested too deeply") from None
    out: dict[str, Any] = {}
    for raw_key, value in data.items():
        key = raw_key.replace("-", "_")
        key = ALIASES.get(key, key)
        if key != "params":  # workload parameters are checked by name too, later
            refuse_secrets(value, f"{path}: {raw_key}")
        if key not in CONFIG_KEYS:
            close = suggest(key, [*CONFIG_KEYS, *ALIASES])
            hint = (
                f"; did you mean {close[0]!r}?"
                if close
                else f"; valid keys: {', '.join(CONFIG_KEYS)}"
            )
            raise UsageError(f"{path}: unknown key {raw_key!r}{hint}")
        if key in out:
            raise UsageError(f"{path}: {raw_key!r} given twice (as {key!r} and an alias)")
        out[key] = convert(key, value, f"{path}: {raw_key}")
    for key in PATH_KEYS:
        if key in out:
            out[key] = str(path.parent / Path(out[key]).expanduser())
    return out


def refuse_secrets(value: Any, where: str) -> None:
    """Refuse an option value that looks like a credential, without echoing it.

    Options end up in sweep.json, error messages and VM command lines; a key
    pasted into the wrong field must stop the sweep before any of those sees it.
    """
    if isinstance(value, dict):
        for item in value.values():
            refuse_secrets(item, where)
    elif isinstance(value, list | tuple):
        for item in value:
            refuse_secrets(item, where)
    elif isinstance(value, str | Path) and SECRET_VALUE_RE.search(str(value)):
        raise UsageError(f"{where}: the value looks like a credential; cloudprof records its "
                         "options, so it refuses secrets in them (not shown here)")


# ---------------------------------------------------------------- the spec


def build_spec(cli: dict[str, Any], config: Path | None = None) -> SweepSpec:
    """A validated SweepSpec from the values given on the command line and the file.

    ``cli`` maps CONFIG_KEYS to what was given; None (or an empty list) means
    "not given", so the file's value, then the SweepSpec default, applies.
    """
    unknown = set(cli) - set(CONFIG_KEYS)
    if unknown:  # a programming error in the caller, not a user error
        raise ValueError(f"unknown option keys {sorted(unknown)}")
    values = read_config(config) if config is not None else {}
    file_params = values.pop("params", {})
    for key, value in cli.items():
        if key != "params":  # workload parameters are checked by name too, later
            refuse_secrets(value, flag_name(key))
    given = {key: convert(key, value) for key, value in cli.items()
             if value is not None and value != [] and value != {}}
    cli_params = given.pop("params", {})
    values.update(given)

    params: dict[str, Any] = {**file_params}
    for key in WORKLOAD_PARAM_KEYS:
        if key in values and key not in given:
            params[key] = values.pop(key)
    params.update(cli_params)
    for key in WORKLOAD_PARAM_KEYS:
        if key in given:
            params[key] = values.pop(key)

    fields: dict[str, Any] = {}
    for key, value in values.items():
        if key in PATH_KEYS:
            value = Path(value).expanduser()
        if key == "max_peak_memory":
            value, fields["peak_gate"] = value
        fields[BY_KEY[key].spec_field] = value
    spec = SweepSpec(**{"machines": [], **fields, "workload_params": params})
    if spec.command is not None and "duration" in values:
        # a job runs to completion unless --duration says
        spec = replace(spec, stop_after_s=spec.duration_s)
    if spec.adaptive and spec.grid:
        raise UsageError("--adaptive picks worker counts for one workload: drop --grid (or "
                         "run one adaptive sweep per grid point)")
    return validate_spec(spec)


def load_run_spec(run_dir: Path) -> SweepSpec:
    """The spec recorded in ``RUN/sweep.json`` (for ``--resume``)."""
    from orchestrator.results.store import SWEEP_FILE

    path = run_dir / SWEEP_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        spec = SweepSpec.from_dict(data["spec"])
    except FileNotFoundError:
        raise UsageError(
            f"--resume: {str(run_dir)!r} is not a run directory (no {SWEEP_FILE})"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"--resume: cannot read the spec in {path}: {exc}") from None
    return spec

