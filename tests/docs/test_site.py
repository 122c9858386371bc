"""The built site shows what `--help` shows and fits the page: the site is built strict into a
folder of the test's own (as `make docs` builds it), then its HTML is read back.

- No placeholder is taken for an HTML tag: `.lab/<lab>/runs/` in a command's help is on the page as
  written, not `.lab//runs/` with an unknown `<lab>` element the browser hides.
- click's `\\b` blocks (the examples) keep their lines: each line is a line of a preformatted block.
- A group's list of subcommands gives each one's whole first sentence, never its first line cut.
- No code block is wider than the content at 1280 px. With docs/assets/ddplab.css and the theme's
  toc.integrate, the content at 1280 px is 1280 - 242 (navigation) - 2 x 24 (margins) = 990 px, and
  a code block's text 990 - 2 x 16 (padding) = 958 px: 117 characters of a 13.6 px monospace font at
  0.6 em a character (DejaVu Sans Mono, Menlo; Consolas is narrower). The limit below leaves room.
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import click
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "docs" / "hooks"))
from ddplab_docs import walk_commands  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CODE_COLUMNS = 110
# Every element the site's pages use: HTML's own, and the inline SVG of the theme's icons.
HTML_TAGS = set("""a abbr article aside b blockquote body br button caption circle code col colgroup dd del details div
dl dt em figcaption figure footer form g h1 h2 h3 h4 h5 h6 head header hr html i iframe img input ins kbd label legend
li link main mark meta nav noscript ol optgroup option p path polygon pre rect script section select small source span
strong style sub summary sup svg table tbody td template textarea tfoot th thead time title tr u ul use var video
wbr""".split())


class Page(HTMLParser):
    """One built page: the tags it has, each <pre>'s text, each <li>'s text, and all its text."""

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.tags: set[str] = set()
        self.pres: list[str] = []
        self.items: list[str] = []
        self.text: list[str] = []
        self._pre = self._li = 0
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        if tag == "pre":
            self._pre += 1
            self.pres.append("")
        elif tag == "li":
            self._li += 1
            self.items.append("")

    def handle_endtag(self, tag):
        if tag == "pre":
            self._pre -= 1
        elif tag == "li":
            self._li -= 1

    def handle_data(self, data):
        self.text.append(data)
        if self._pre:
            self.pres[-1] += data
        if self._li:
            self.items[-1] += data


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> dict[str, Page]:
    folder = tmp_path_factory.mktemp("site")
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(folder)], cwd=REPO,
                           capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert built.returncode == 0, built.stderr[-3000:]
    return {str(p.relative_to(folder)): Page(p.read_text()) for p in sorted(folder.rglob("*.html"))
            if "assets" not in p.parts}


def commands() -> list[click.Command]:
    """Every command, as the site's hook walks them (docs/hooks/ddplab_docs.py)."""
    from labctl.cli.app import load_all_commands, main

    load_all_commands()
    return list(walk_commands(main))


def help_of(command: click.Command) -> str:
    return inspect.cleandoc(command.help or "")


def test_no_placeholder_is_taken_for_a_tag(site):
    unknown = {name: sorted(page.tags - HTML_TAGS) for name, page in site.items() if page.tags - HTML_TAGS}
    assert not unknown, f"elements no browser knows (a placeholder such as <lab> read as a tag): {unknown}"
    cli = "".join(site["reference/cli.html"].text)
    for command in commands():
        for placeholder in set(re.findall(r"<[a-z_-]+>", help_of(command))):
            assert placeholder in cli, f"`{command.name}`'s help says {placeholder}; the CLI page lost it"


def test_example_blocks_keep_their_lines(site):
    lines = {line.rstrip() for pre in site["reference/cli.html"].pres for line in pre.splitlines()}
    blocks = 0
    for command in commands():
        for block in re.findall(r"^\s*\x08\n(.*?)(?:\n\s*\n|\Z)", help_of(command), re.S | re.M):
            blocks += 1
            missing = [line for line in block.splitlines() if line.rstrip() not in lines]
            assert not missing, f"`{command.name}`: these lines of an example block ran together: {missing}"
    assert blocks >= 7  # the top-level "Typical session" and the commands' "Examples:"


def test_every_summary_is_a_whole_sentence(site):
    summaries = [item for item in site["reference/cli.html"].items if re.match(r"^\s*[a-z-]+: ", item)]
    assert len(summaries) >= 20
    cut = [s for s in summaries if not re.search(r"[.!?)]\s*$", s)]
    assert not cut, f"summaries that stop mid-sentence: {cut}"


def test_no_code_block_is_wider_than_the_content(site):
    wide = [f"{name}: {len(line)} characters: {line[:60]}..." for name, page in site.items() for pre in page.pres
            for line in pre.splitlines() if len(line) > CODE_COLUMNS]
    assert not wide, f"{len(wide)} lines wider than {CODE_COLUMNS} characters:\n" + "\n".join(wide)
