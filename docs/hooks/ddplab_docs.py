"""MkDocs hooks for ddplab's site: pages that are generated from the code, so they cannot drift.

- The CLI reference (mkdocs-click) reads `labctl.cli.app.main`, whose commands load lazily, one
  module per group, when click asks for them. mkdocs-click documents the group's `commands` as it
  finds them, so every command module is imported first (labctl's own `load_all_commands`) and the
  commands are put in name order, as `labctl -h` lists them. Their help, written for a terminal,
  is made Markdown for the page only (`--help` is untouched): a `\\b` block (click's "keep these
  lines") becomes a preformatted block, a `<placeholder>` outside code is not taken for an HTML tag,
  and a subcommand's summary in its group's list is its whole first sentence, not its first line.
- `<!-- ddplab:config-keys -->` in a page becomes the table of every setting: its key, default and
  comment from `.env.example` (which `tests/unit/test_config.py` holds to `labctl.spec.labspec.SETTINGS`),
  and the option that sets it, from the click tree.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import click

CONFIG_KEYS = "<!-- ddplab:config-keys -->"
REPO = Path(__file__).resolve().parents[2]


def on_config(config):
    from labctl.cli.app import load_all_commands, main

    load_all_commands()
    main.commands = dict(sorted(main.commands.items()))
    for command in walk_commands(main):
        if command.help:
            command.short_help = command.short_help or first_sentence(command.help)
            command.help = help_markdown(command.help)
    return config


def walk_commands(command: click.Command):
    """The command and every command under it."""
    yield command
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            yield from walk_commands(sub)


def paragraphs(help_text: str) -> list[list[str]]:
    """A click help text as its paragraphs, each a list of lines (click's own reading: blank lines part them)."""
    found: list[list[str]] = [[]]
    for line in inspect.cleandoc(help_text).splitlines():
        if line.strip():
            found[-1].append(line)
        elif found[-1]:
            found.append([])
    return [p for p in found if p]


def help_markdown(help_text: str) -> str:
    """A command's help as Markdown that renders what `--help` prints: a paragraph that starts with
    `\\b` as a preformatted block, line for line; elsewhere, `<` and `>` outside code as entities."""
    out = []
    for lines in paragraphs(help_text):
        if lines[0].strip() == "\b":
            out.append("\n".join(["```text", *lines[1:], "```"]))
        else:
            out.append(escape_angles("\n".join(lines)))
    return "\n\n".join(out)


def first_sentence(help_text: str) -> str:
    """A command's summary for its group's list: the first sentence of its first paragraph, whole."""
    words = " ".join(line.strip() for line in paragraphs(help_text)[0])
    match = re.search(r"[.!?](\s|$)", words)
    return escape_angles(words[: match.end()].strip() if match else words)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if CONFIG_KEYS in markdown:
        markdown = markdown.replace(CONFIG_KEYS, config_table())
    return markdown


def env_example() -> list[tuple[str, str, str]]:
    """(key, default, comment) for every KEY=VALUE line of .env.example, in its order."""
    rows, comment = [], []
    for line in (REPO / ".env.example").read_text().splitlines():
        if line.startswith("#"):
            comment.append(line.lstrip("#").strip())
        elif "=" in line:
            key, value = line.split("=", 1)
            rows.append((key.strip(), value.strip(), " ".join(comment)))
            comment = []
        else:
            comment = []
    return rows


def options_by_setting() -> dict[str, list[str]]:
    """setting -> the options named like it: `labctl up`'s where it has one (the lab spec comes
    from there), else every command's."""
    from labctl.cli.app import load_all_commands, main

    load_all_commands()
    found: dict[str, list[str]] = {}

    def walk(cmd: click.Command, path: list[str]) -> None:
        for param in cmd.params:
            if isinstance(param, click.Option):
                found.setdefault(param.name, []).append(f"{' '.join(path)} {max(param.opts, key=len)}")
        if isinstance(cmd, click.Group):
            for name, sub in sorted(cmd.commands.items()):
                walk(sub, [*path, name])

    walk(main, ["labctl"])
    return {name: [o for o in opts if o.startswith("labctl up ")] or opts for name, opts in found.items()}


def config_table() -> str:
    from labctl.spec.labspec import SETTINGS

    by_key = {key: name for name, (key, _parse) in SETTINGS.items()}
    options = options_by_setting()
    lines = ["| key | default | option | what it sets |", "| --- | --- | --- | --- |"]
    for key, default, comment in env_example():
        name = by_key.get(key)
        if name == "lab":
            option = "`--lab` on every command that works on one lab"
        else:
            option = ", ".join(f"`{o}`" for o in options.get(name, [])) or "(no flag)"
        shown = f"`{default}`" if default else "(empty)"
        lines.append(f"| `{key}` | {shown} | {option} | {escape(comment)} |")
    return "\n".join(lines)


def escape(text: str) -> str:
    """A comment as table-cell Markdown: pipes escaped, and `<` and `>` outside code as entities."""
    return escape_angles(text.replace("|", "\\|"))


def escape_angles(text: str) -> str:
    """Outside `code` spans, `<` and `>` as entities: `.lab/<lab>/` is not an HTML tag."""
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(p if p.startswith("`") else p.replace("<", "&lt;").replace(">", "&gt;") for p in parts)
