"""Each sweep option is declared once (orchestrator/spec/options.py): the command, the
sweep.toml keys, the spec and the reference page all come from that table."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

from orchestrator.spec.config import build_spec, read_config
from orchestrator.spec.options import (
    ALIASES,
    CONFIG_KEYS,
    SWEEP_OPTIONS,
    config_keys_table,
    flag_name,
    options_table,
)
from orchestrator.spec.spec import SweepSpec

ROOT = Path(__file__).resolve().parent.parent
# what build_spec derives, never given by a user directly
DERIVED_FIELDS = {"peak_gate", "stop_after_s", "workload_params"}


def test_every_spec_field_a_user_sets_has_exactly_one_option():
    fields = {f.name for f in dataclasses.fields(SweepSpec)}
    set_by = [o.spec_field for o in SWEEP_OPTIONS
              if o.in_config and not o.workload_param and o.key != "params"]
    assert len(set_by) == len(set(set_by))
    assert set(set_by) == fields - DERIVED_FIELDS


def test_flags_keys_and_aliases_are_unique():
    flags = [n for o in SWEEP_OPTIONS for name in o.names for n in name.split("/")]
    assert len(flags) == len(set(flags))
    assert not set(ALIASES) & set(CONFIG_KEYS)
    assert len({o.param for o in SWEEP_OPTIONS}) == len(SWEEP_OPTIONS)


def test_sweep_help_lists_every_option_with_its_help():
    env = {**os.environ, "COLUMNS": "400", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "orchestrator", "sweep", "--help"],
                         capture_output=True, text=True, env=env, check=True).stdout
    for option in SWEEP_OPTIONS:
        assert option.flag in out, option.flag
        assert option.help.split(" (")[0].split(":")[0][:30] in out, option.key


def test_the_reference_tables_name_every_option_and_key():
    table, keys = options_table(), config_keys_table()
    for option in SWEEP_OPTIONS:
        assert f"`{option.flag}`" in table
        if option.in_config:
            assert f"| `{option.key}` |" in keys and f"`{flag_name(option.key)}`" in keys
    page = (ROOT / "docs" / "reference" / "commands.md").read_text()
    assert "<!-- generated: sweep options -->" in page
    assert "<!-- generated: sweep.toml keys -->" in page


def test_a_flag_and_its_sweep_toml_key_give_the_same_spec(tmp_path):
    out = str(tmp_path / "runs")
    toml = tmp_path / "sweep.toml"
    toml.write_text(f'machine = "n2-highcpu-8"\nworkers = "1-4"\nduration_s = "2s"\n'
                    f'max-peak-memory = "trial:1G"\nfamily = ["n2-highcpu"]\nout = "{out}"\n'
                    'search = "cost"\n')
    from_file = build_spec({}, toml)
    from_flags = build_spec({"machines": ["n2-highcpu-8"], "workers": "1-4", "duration": "2s",
                             "max_peak_memory": "trial:1G", "family": ["n2-highcpu"],
                             "out": out, "search": "cost"})
    assert from_file == from_flags
    assert from_file.duration_s == 2.0 and from_file.peak_gate == "trial"
    assert set(read_config(toml)) <= set(CONFIG_KEYS)


def test_validating_a_spec_returns_a_new_one_and_leaves_the_given_one_as_it_was(tmp_path):
    from orchestrator.spec.validate import validate_spec

    given = SweepSpec(machines=["n2-highcpu-8"], zone="us-central1-a", out=tmp_path / "runs")
    before = dataclasses.asdict(given)
    valid = validate_spec(given)
    assert (valid.provider, valid.region) == ("gcp", "us-central1")
    assert dataclasses.asdict(given) == before and given.provider is None
    assert validate_spec(given) == valid  # the same answer twice
