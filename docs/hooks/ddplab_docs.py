"""MkDocs hooks for ddplab's site: pages that are generated from the code, so they cannot drift.

- The CLI reference (mkdocs-click) reads `labctl.cli.app.main`, whose commands load lazily, one
  module per group, when click asks for them. mkdocs-click documents the group's `commands` as it
  finds them, so every command module is imported first (labctl's own `load_all_commands`) and the
  commands are put in name order, as `labctl -h` lists them.
- `<!-- ddplab:config-keys -->` in a page becomes the table of every setting: its key, default and
  comment from `.env.example` (which `tests/unit/test_config.py` holds to `labctl.spec.labspec.SETTINGS`),
  and the option that sets it, from the click tree.
"""

from __future__ import annotations

import re
from pathlib import Path

import click

CONFIG_KEYS = "<!-- ddplab:config-keys -->"
REPO = Path(__file__).resolve().parents[2]


def on_config(config):
    from labctl.cli.app import load_all_commands, main

    load_all_commands()
    main.commands = dict(sorted(main.commands.items()))
    return config


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
    """A comment as table-cell Markdown: pipes escaped, and outside `code` spans `<` and `>` as
    entities (`.lab/<lab>/` is not an HTML tag)."""
    parts = re.split(r"(`[^`]*`)", text.replace("|", "\\|"))
    return "".join(p if p.startswith("`") else p.replace("<", "&lt;").replace(">", "&gt;") for p in parts)
