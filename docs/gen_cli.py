"""The command-line reference page, generated from cloudprof's own Typer app.

Written from the click objects that ``cloudprof --help`` prints, so the page cannot
drift from the options a user really has: each command's usage line, help text and
options (grouped by the panels ``--help`` shows), with metavars, choices and defaults.

Used two ways:

* as a MkDocs hook (``hooks:`` in ``mkdocs.yml``): ``on_files`` adds the page
  ``reference/cli.md`` to every build, so the site always documents the code it was
  built from and nothing generated is committed;
* as a script: ``python docs/gen_cli.py`` prints the same Markdown.

``on_page_markdown`` also fills the tables the reference pages mark: the sweep
options and ``sweep.toml`` keys (``orchestrator/spec/options.py``, where each option
is declared once) and the environment settings (``orchestrator/settings.py``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PAGE = "reference/cli.md"  # where the page lands in the site (docs/ relative)
TITLE = "CLI reference"
ROOT = Path(__file__).resolve().parent.parent  # the checkout: orchestrator/ lives here


def _app_command() -> Any:
    """The click command behind ``cloudprof``, imported from this checkout."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import typer

    from orchestrator.cli import app

    return typer.main.get_command(app)


def _walk(command: Any, ctx: Any) -> Iterator[tuple[Any, Any]]:
    """Each command with its click context, parents before children, subcommands sorted."""
    import click

    yield command, ctx
    for name in sorted(getattr(command, "commands", {})):
        sub = command.commands[name]
        if getattr(sub, "hidden", False):
            continue
        yield from _walk(sub, click.Context(sub, info_name=name, parent=ctx))


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell (one line, no pipes, no raw HTML)."""
    text = " ".join(text.split())
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _names(param: Any, ctx: Any) -> str:
    names = [*param.opts, *getattr(param, "secondary_opts", [])]
    if param.param_type_name == "argument":
        return f"`{(param.metavar or param.name).upper()}`"
    text = ", ".join(f"`{n}`" for n in names)
    metavar = param.metavar
    if metavar is None and not getattr(param, "is_flag", False):
        metavar = param.make_metavar(ctx)
    if metavar:
        text += f" `{metavar}`"
    return text


def _default(param: Any) -> str:
    import click

    default = param.default
    if default is None or callable(default) or (getattr(param, "is_flag", False) and not default):
        return ""
    if isinstance(default, (list, tuple)):
        if not default:
            return ""
        default = ",".join(str(d) for d in default)
    if hasattr(default, "value"):  # an Enum member
        default = default.value
    if isinstance(param.type, click.types.BoolParamType) and param.secondary_opts:
        return f"`{param.opts[0] if default else param.secondary_opts[0]}`"
    return f"`{default}`"


def _row(param: Any, ctx: Any) -> str:
    import click

    help_text = getattr(param, "help", None) or ""
    if isinstance(param.type, click.Choice):
        choices = ", ".join(f"`{c}`" for c in param.type.choices)
        help_text = f"{help_text} One of {choices}." if help_text else f"One of {choices}."
    if getattr(param, "required", False):
        help_text += " Required."
    return f"| {_names(param, ctx)} | {_cell(help_text)} | {_default(param)} |"


def _panels(command: Any, ctx: Any) -> dict[str, list[Any]]:
    """The command's parameters by the panel ``--help`` lists them under, in its order."""
    panels: dict[str, list[Any]] = {}
    for param in command.get_params(ctx):
        if getattr(param, "hidden", False) or param.name == "help":
            continue
        default_panel = "Arguments" if param.param_type_name == "argument" else "Options"
        panel = getattr(param, "rich_help_panel", None) or default_panel
        panels.setdefault(panel, []).append(param)
    return panels


def render() -> str:
    """The whole page as Markdown."""
    import click

    root = _app_command()
    out = [
        f"# {TITLE}",
        "",
        "Generated from the command-line app itself each time the site is built",
        "(`docs/gen_cli.py`), so it lists exactly what `cloudprof COMMAND --help` prints.",
        "The [command-line reference](commands.md) explains the options in more depth.",
        "",
    ]
    for command, ctx in _walk(root, click.Context(root, info_name="cloudprof")):
        path = ctx.command_path
        level = "#" * min(2 + path.count(" "), 4)
        out += [f"{level} `{path}`", "", "```text", command.get_usage(ctx), "```", ""]
        help_text = (command.help or "").strip()
        if help_text:
            out += [help_text.split("\f")[0].strip(), ""]
        subs = [n for n, c in sorted(getattr(command, "commands", {}).items()) if not c.hidden]
        if subs:
            out += ["Commands: " + ", ".join(f"`{path} {n}`" for n in subs) + ".", ""]
        for panel, params in _panels(command, ctx).items():
            out += [f"**{panel}**", "", "| option | meaning | default |", "| --- | --- | --- |"]
            out += [_row(p, ctx) for p in params] + [""]
    return "\n".join(out).rstrip() + "\n"


TABLES = {  # marker in a page -> (module, function, arguments) that write its table
    "<!-- generated: sweep options -->": ("orchestrator.spec.options", "options_table", ()),
    "<!-- generated: sweep.toml keys -->": ("orchestrator.spec.options", "config_keys_table", ()),
    "<!-- generated: settings user -->": ("orchestrator.settings", "markdown_table", ("user",)),
    "<!-- generated: settings host -->": ("orchestrator.settings", "markdown_table", ("host",)),
    "<!-- generated: settings test seam -->": ("orchestrator.settings", "markdown_table",
                                               ("test seam",)),
}


def fill_tables(markdown: str) -> str:
    """A page with each table marker replaced by the table, from the code's one list of it
    (the sweep options, the environment settings)."""
    if not any(marker in markdown for marker in TABLES):
        return markdown
    import importlib

    _app_command()  # puts this checkout on sys.path
    for marker, (module, name, args) in TABLES.items():
        if marker in markdown:
            table = getattr(importlib.import_module(module), name)(*args)
            markdown = markdown.replace(marker, table)
    return markdown


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """MkDocs hook: the option tables of the reference pages, generated at every build."""
    return fill_tables(markdown)


def on_files(files: Any, config: Any) -> Any:
    """MkDocs hook: add the generated page to the build."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=render()))
    return files


if __name__ == "__main__":
    sys.stdout.write(render())
