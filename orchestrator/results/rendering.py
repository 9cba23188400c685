"""The report's figures as files and scripts: SVG drawn by vl-convert (no browser,
no network), and Vega's scripts to inline in report.html. ``plots`` makes the charts,
``publish`` the pages; what turns a chart into bytes is here, and only here imports
vl-convert (0.6 s), so code that makes specs alone never pays for it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import altair as alt

from orchestrator.results.plots import Drawn, spec


def to_svg(chart: Any) -> str:
    """The chart (or its spec) as a standalone SVG (vl-convert: no browser, no network)."""
    import vl_convert as vlc

    return vlc.vegalite_to_svg(chart if isinstance(chart, dict) else spec(chart),
                               vl_version=_vl_version())


def _vl_version() -> str:
    """The Vega-Lite version Altair writes its specs for ("v6.4.1" -> "6.4")."""
    return ".".join(alt.SCHEMA_VERSION.lstrip("v").split(".")[:2])


def bundle_name() -> str:
    """The kept bundle's file name: the versions that make it."""
    import vl_convert as vlc

    return f"vega-bundle-{vlc.__version__}-vl{_vl_version()}.js"


@cache
def javascript() -> str:
    """Vega, Vega-Lite and vega-embed as one script to inline in a page (no network).

    Bundling takes vl-convert a few seconds and gives the same 0.9 MB for the same
    versions, so it is kept in the cache (``$CLOUDPROF_CACHE/report/``) keyed by them:
    only a machine's first report pays for it. A cache that cannot be read or written
    costs the bundling, never the report."""
    import vl_convert as vlc

    from orchestrator.atomic import atomic_write_bytes
    from orchestrator.settings import REPORT_BUNDLE_DIR, cache_root

    kept = Path(REPORT_BUNDLE_DIR.get() or cache_root() / "report") / bundle_name()
    try:
        return kept.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        pass
    bundle = vlc.javascript_bundle(vl_version=_vl_version())
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(kept, bundle.encode("utf-8"))
    except OSError:
        pass
    return bundle


@contextlib.contextmanager
def figures_written(figures: list[Drawn], out_dir: Path, run_dir: Path
                    ) -> Iterator[list[tuple[str, str]]]:
    """Each named figure written as ``out_dir/<name>`` (SVG) by the end of the block; the
    block gets the (path relative to the store, caption) pairs, as report.md links them.

    vl-convert renders outside the GIL, in up to four threads: each figure is handed to
    them as soon as its spec is made (the largest, throughput, first), and the block (the
    pages, rendered in Python) runs while they draw, so on a second core the drawing costs
    no time of its own. The files are written once all are drawn."""
    from concurrent.futures import ThreadPoolExecutor

    from orchestrator.atomic import atomic_write_bytes

    out_dir.mkdir(parents=True, exist_ok=True)
    rel = out_dir.relative_to(run_dir) if out_dir.is_relative_to(run_dir) else out_dir
    named = [drawn for drawn in figures if drawn.name]
    with ThreadPoolExecutor(max_workers=max(1, min(4, len(named)))) as pool:
        drawing = [pool.submit(to_svg, drawn.spec()) for drawn in named]
        yield [((rel / drawn.name).as_posix(), drawn.caption) for drawn in named]
        for drawn, svg in zip(named, drawing, strict=True):
            atomic_write_bytes(out_dir / drawn.name, svg.result().encode())
