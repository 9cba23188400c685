"""The documentation a user reads is true: the site builds, its links land, its commands run.

README.md stays a five-minute read; the MkDocs site (``mkdocs.yml``, ``docs/``) holds the
rest. The site is built with ``--strict`` (a broken link, anchor or include fails it), the
generated CLI reference is checked against the app's own options, every relative link of
README and the pages must point at a file that exists, and the commands of every code
block marked ``<!-- runnable -->`` are run for real and must exit 0.
"""

from __future__ import annotations

import html
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.in_process import Called, cloudprof

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
README = REPO / "README.md"
RUNNABLE = "<!-- runnable -->"
# Pages that docs/gen_cli.py adds at build time (not files in docs/).
GENERATED = {DOCS / "reference" / "cli.md"}

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*```")


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def _prose(text: str) -> str:
    """The text outside fenced blocks and inline code, where Markdown links live."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(out)


def _github_anchors(text: str) -> set[str]:
    """The heading anchors GitHub gives a Markdown file."""
    anchors = set()
    for line in _prose(text).splitlines():
        match = re.match(r"^#{1,6}\s+(.*)$", line)
        if match:
            title = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower())
            anchors.add(title.replace(" ", "-"))
    return anchors


def _runnable_blocks() -> list[tuple[str, str]]:
    """(page, command) for each command line of each block marked runnable."""
    found = []
    for page in _pages():
        lines = page.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if line.strip() != RUNNABLE:
                continue
            assert i + 1 < len(lines) and FENCE.match(lines[i + 1]), (
                f"{page.name}:{i + 1}: {RUNNABLE} must come right before a fenced block"
            )
            for body in lines[i + 2:]:
                if FENCE.match(body):
                    break
                command = body.split(" #", 1)[0].strip()
                if command:
                    found.append((str(page.relative_to(REPO)), command))
    return found


def test_readme_is_a_five_minute_read_that_opens_with_make_demo_then_make_test():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300
    quick = text.split("## Quick start", 1)[1]
    first_block = re.search(r"```sh\n(.*?)```", quick, re.S)
    assert first_block is not None and first_block.group(1) == "make demo\nmake test\n"


def test_every_relative_link_resolves():
    broken = []
    for page in _pages():
        text = page.read_text(encoding="utf-8")
        for target in LINK.findall(_prose(text)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            if not (resolved.exists() or resolved in GENERATED):
                broken.append(f"{page.relative_to(REPO)}: {target}")
            elif (anchor and page == README and resolved.suffix == ".md"  # pages: mkdocs checks
                  and anchor not in _github_anchors(resolved.read_text(encoding="utf-8"))):
                broken.append(f"README.md: {target} names no heading there")
    assert not broken, "links that lead nowhere:\n" + "\n".join(broken)
    assert len(LINK.findall(_prose(README.read_text(encoding="utf-8")))) >= 10


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built once with ``mkdocs build --strict`` (any warning fails it)."""
    pytest.importorskip("mkdocs", reason="the [docs] extra (make test installs it)")
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict",
         "-f", str(REPO / "mkdocs.yml"), "-d", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=240,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_the_site_builds_strict_with_every_page_of_the_nav(site):
    for page in sorted(DOCS.rglob("*.md")):
        built = site / page.relative_to(DOCS).with_suffix("") / "index.html"
        if page.name == "index.md":
            built = site / page.relative_to(DOCS).parent / "index.html"
        assert built.is_file(), f"{page.relative_to(REPO)} was not built"
    # the benchmarks page is the one run_all.py generated: commands, no machine paths
    benchmarks = (site / "benchmarks" / "index.html").read_text(encoding="utf-8")
    assert "generated by benchmarks/run_all.py" in (DOCS / "benchmarks.md").read_text()
    text = html.unescape(re.sub(r"<[^>]+>", "", benchmarks))  # code is highlighted in spans
    assert "python benchmarks/bench_report.py" in text and "/tmp/" not in text
    assert "--8&lt;--" not in benchmarks


def test_the_cli_reference_lists_every_command_and_option_of_the_app(site):
    import click
    import typer

    from orchestrator.cli import app

    page = html.unescape((site / "reference" / "cli" / "index.html").read_text("utf-8"))

    def walk(command: click.Command, path: str) -> None:
        assert f"Usage: {path}" in page, path
        for param in command.params:
            for opt in param.opts if isinstance(param, click.Option) else []:
                assert opt in page, f"{path} {opt}"
            if param.help if isinstance(param, click.Option) else False:
                assert " ".join(param.help.split())[:40] in page, f"{path} {param.name}"
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, f"{path} {name}")

    walk(typer.main.get_command(app), "cloudprof")
    assert "--max-peak-memory" in page and "Usage: cloudprof catalog refresh" in page


def test_trials_columns_are_documented_exactly():
    from orchestrator.results.store import ALL_COLUMNS

    text = (DOCS / "reference" / "results-store.md").read_text(encoding="utf-8")
    table = text.split("## `trials.parquet`'s columns", 1)[1]
    documented = []
    for line in table.splitlines():
        if line.startswith("| `"):
            documented += re.findall(r"`([a-z0-9_]+)`", line.split("|")[1])
    assert sorted(documented) == sorted(ALL_COLUMNS)


def test_what_is_where_names_only_paths_that_exist():
    text = (DOCS / "reference" / "layout.md").read_text(encoding="utf-8")
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| `")]
    assert len(rows) >= 10
    missing = []
    for first, what in rows:
        folders = [REPO / p.rstrip("/") for p in re.findall(r"`([^`]+)`", first)]
        missing += [str(f.relative_to(REPO)) for f in folders if not f.exists()]
        for name in re.findall(r"`([\w/]+\.py)`", what):
            if "/" in name:  # a path from the top of the checkout
                found = (REPO / name).is_file()
            else:  # a module of the row's folder or of one below it
                found = any(any(f.rglob(name)) for f in folders if f.is_dir())
            if not found:
                missing.append(f"{name} (under {first.strip('| ')})")
    assert not missing, missing


def test_what_is_where_names_every_module():
    """The map matches the tree both ways: a module nobody wrote down is a room a newcomer
    cannot find."""
    text = (DOCS / "reference" / "layout.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`(?:[\w/]+/)?([\w]+\.py)`", text))
    unnamed = [str(p.relative_to(REPO)) for package in ("orchestrator", "workloads")
               for p in sorted((REPO / package).rglob("*.py"))
               if p.name != "__init__.py" and "_data" not in p.parts and p.name not in named]
    assert not unnamed, unnamed


RUNNABLE_COMMANDS = _runnable_blocks()
# Each command once, with the pages that give it: a command two pages give runs alike.
RUNNABLE_PAGES: dict[str, list[str]] = {}
for _page, _command in RUNNABLE_COMMANDS:
    RUNNABLE_PAGES.setdefault(_command, []).append(_page)
SHELL = {"|", "||", "&&", ";", "&", ">", ">>", "<", "2>", "$("}


def test_the_runnable_blocks_cover_the_cheap_commands():
    commands = {c for _, c in RUNNABLE_COMMANDS}
    assert "cloudprof --help" in commands
    assert "cloudprof catalog --min-vcpus 32" in commands
    assert "cloudprof sweep --machine n2-highcpu-8 --plan" in commands
    assert any("--dry-run" in c for c in commands)


def _run_as_typed(command: str, cwd: Path) -> Called:
    """A runnable line as a user types it, in ``cwd`` with a cache of its own; in this
    process (tests/fixtures/in_process.py: the console script is tested in test_cli.py),
    which a runnable block's plain ``cloudprof ...`` line allows."""
    pages = ", ".join(RUNNABLE_PAGES[command])
    argv = shlex.split(command)
    assert argv[0] == "cloudprof", f"{pages}: only cloudprof commands run here"
    assert not SHELL & set(argv), f"{pages}: one plain command a line, no shell"
    return cloudprof(*argv[1:], cwd=cwd, env={"CLOUDPROF_CACHE": str(cwd / "cache")},
                     columns=120)


DRY_RUN = next(c for c in RUNNABLE_PAGES if "--dry-run" in c)


@pytest.fixture(scope="module")
def docs_dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Called, Path]:
    """The docs' dry-run sweep, run once as typed in an empty directory: (what it did,
    the directory). Its runnable-line test and the report --json test both read it."""
    cwd = tmp_path_factory.mktemp("docs-dry-run")
    return _run_as_typed(DRY_RUN, cwd), cwd


@pytest.mark.slow
@pytest.mark.parametrize("command", list(RUNNABLE_PAGES), ids=lambda c: c[:40])
def test_a_runnable_command_of_the_docs_exits_0(command, tmp_path, request):
    """Run as a user types it, in an empty directory with a cache of its own."""
    done = (request.getfixturevalue("docs_dry_run")[0] if command == DRY_RUN
            else _run_as_typed(command, tmp_path))
    pages = ", ".join(RUNNABLE_PAGES[command])
    assert done.returncode == 0, f"{pages}: {command}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    assert done.stdout.strip(), f"{pages}: {command} printed nothing"


def _report_json_table() -> dict[str, str]:
    """The docs' table of ``report --json``'s top-level keys: key -> what it holds."""
    text = (DOCS / "reference" / "report.md").read_text(encoding="utf-8")
    table = text.split("| `report --json` key | holds |", 1)[1]
    rows = {}
    for line in table.splitlines()[2:]:
        if not line.startswith("| `"):
            break
        key, holds = line[2:].split(" | ", 1)
        rows[key.strip("`")] = holds
    return rows


@pytest.mark.slow
def test_report_json_has_exactly_the_documented_keys(docs_dry_run):
    """A real dry run's ``report --json`` (the docs' own dry run): its keys are the table's
    (``scale_out`` comes only with ``--nodes``, as the table says), and a result row's are
    the ones listed."""
    swept, cwd = docs_dry_run
    assert swept.returncode == 0, swept.stderr[-2000:]
    (run,) = (cwd / "runs").iterdir()
    done = cloudprof("report", str(run), "--json", cwd=cwd,
                     env={"CLOUDPROF_CACHE": str(cwd / "cache")})
    assert done.returncode == 0, done.stderr[-2000:]
    import json

    document = json.loads(done.stdout)
    documented = _report_json_table()
    assert "--nodes" in documented["scale_out"]
    assert set(document) == set(documented) - {"scale_out"}
    listed = set(re.findall(r"`([a-z0-9_]+)`", documented["results"]))
    assert set(document["results"][0]) <= listed
