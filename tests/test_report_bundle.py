"""The report page's inlined JavaScript is bundled once per machine, not once per report."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.results import rendering


@pytest.fixture
def fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CLOUDPROF_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("CLOUDPROF_REPORT_BUNDLE_DIR", raising=False)  # the suite's shared one
    rendering.javascript.cache_clear()
    yield tmp_path / "cache"
    rendering.javascript.cache_clear()


def test_the_bundle_is_kept_and_a_later_process_reads_it_back(fresh: Path) -> None:
    bundle = rendering.javascript()
    (kept,) = (fresh / "report").glob("vega-bundle-*.js")
    assert kept.read_text(encoding="utf-8") == bundle and "vegaEmbed" in bundle
    kept.write_text("/* kept */", encoding="utf-8")  # what the next process gets
    rendering.javascript.cache_clear()
    assert rendering.javascript() == "/* kept */"


def test_a_cache_that_cannot_be_written_still_gives_the_bundle(fresh: Path) -> None:
    fresh.mkdir(parents=True)
    (fresh / "report").write_text("not a directory")
    bundle = rendering.javascript()
    assert "vegaEmbed" in bundle and (fresh / "report").read_text() == "not a directory"


def test_a_bundle_directory_of_its_own_is_used_instead_of_the_cache(
        fresh: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLOUDPROF_REPORT_BUNDLE_DIR", str(tmp_path / "shared"))
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / rendering.bundle_name()).write_text("/* shared */", encoding="utf-8")
    assert rendering.javascript() == "/* shared */"
    assert not (fresh / "report").exists()
