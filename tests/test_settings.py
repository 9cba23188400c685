"""``orchestrator/settings.py`` lists every CLOUDPROF_* variable, and the docs list the same."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

from orchestrator import settings
from orchestrator.errors import UsageError
from orchestrator.spec.environment import CHECKS, check_environment
from workloads.job import BUILTIN_PLACEHOLDERS

REPO = Path(__file__).resolve().parent.parent
NAME_RE = re.compile(r"CLOUDPROF_[A-Z0-9_]*[A-Z0-9]")
# what a --command job is given (workloads.job.job_env), not settings cloudprof reads
JOB_VARIABLES = {f"CLOUDPROF_{p.upper()}" for p in BUILTIN_PLACEHOLDERS} | {"CLOUDPROF_NAME"}


def _names_in_code(root: Path) -> set[str]:
    """Every string constant in ``root``'s Python that is a whole CLOUDPROF_* name."""
    found = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and NAME_RE.fullmatch(node.value):
                found.add(node.value)
    return found


def test_every_variable_the_code_names_is_listed() -> None:
    named = _names_in_code(REPO / "orchestrator") | _names_in_code(REPO / "workloads")
    assert named, "the scan found no CLOUDPROF_ name at all"
    assert named - set(settings.BY_NAME) == set()


def test_settings_are_unique_and_described() -> None:
    assert len(settings.BY_NAME) == len(settings.SETTINGS)
    for s in settings.SETTINGS:
        assert NAME_RE.fullmatch(s.name), s.name
        assert s.kind in (settings.USER, settings.HOST, settings.SEAM)
        assert s.type and s.purpose and s.default, s.name
        assert "|" not in s.type + s.purpose + s.default, "would break the docs table"


def test_docs_reference_lists_exactly_the_settings() -> None:
    sys.path.insert(0, str(REPO / "docs"))
    from gen_cli import fill_tables

    page = fill_tables((REPO / "docs" / "reference" / "settings.md").read_text(encoding="utf-8"))
    for kind in (settings.USER, settings.HOST, settings.SEAM):
        assert settings.markdown_table(kind) in page, kind  # the site's page, as built
    documented = set()
    for path in (REPO / "docs" / "reference").glob("*.md"):
        documented |= set(NAME_RE.findall(fill_tables(path.read_text(encoding="utf-8"))))
    assert documented - JOB_VARIABLES == set(settings.BY_NAME)


def test_every_setting_read_on_this_machine_is_checked_up_front() -> None:
    """A user setting or seam read by orchestrator/ is refused before anything is paid for
    when its value is bad (the host settings are read where trials run)."""
    read_here = {s.name for s in settings.SETTINGS if s.kind != settings.HOST}
    assert set(CHECKS) == read_here


def test_a_bad_setting_is_one_line_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.DELETE_BACKOFF_S.name, "forever")
    with pytest.raises(UsageError, match="CLOUDPROF_DELETE_BACKOFF_S='forever'"):
        check_environment()
    monkeypatch.setenv(settings.DELETE_BACKOFF_S.name, "")
    assert settings.DELETE_BACKOFF_S.get() is None
    check_environment()  # empty means the default: nothing to refuse


def test_cache_root_follows_the_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(settings.CACHE.name, str(tmp_path))
    assert settings.cache_root() == tmp_path
    monkeypatch.delenv(settings.CACHE.name)
    assert settings.cache_root() == Path.home() / ".cache" / "cloudprof"
