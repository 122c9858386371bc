"""The documentation's code blocks as tests: parsing, running and comparing (used by test_docs.py).

Sybil (https://sybil.readthedocs.io) lexes the Markdown and runs the examples: its fenced-block
lexer knows CommonMark's fences (inside list items and quotes too), its HTML-comment lexer reads
`<!-- invisible-code-block: python ... -->` checks, and its Document evaluates each example in
order in one namespace per document, with line numbers for every failure. What it does not have is
a shell evaluator that compares a command's output with the block shown after it, which is this
module's part.

The conventions, for whoever writes a page (docs/tutorial.md says them to its readers too):

- ```bash (or sh, shell) and ```python blocks are runnable: each one is run, in the order of the
  page, from the repository's root with `.venv/bin` first on PATH, as a reader would type it.
  Every other fence is shown, not run, and says what it is: ```text for output, ```toml for a
  file, ... A fence without a language is an error: nothing is left to guess.
- A ```text block that follows a runnable block, with nothing but blank lines or an
  `<!-- output: ... -->` comment between, is its output, and is compared with what really came
  (stdout and stderr together, as a terminal shows them):
    - `<!-- output: exact -->`: line for line; a line `...` stands for any lines, and `...` inside a
      line for any text. For output that is the same on every run.
    - otherwise (`pattern`): every line shown must be found in the output, in any order (ranks print
      in the order they finish), with every number standing for any number, runs of spaces and
      table rules of any length, any run's id (20261126-101555-5929) for a run's id and any quoted
      16-hex-digit checksum for a checksum; `...` as above; without a `...` line, no line may be left
      over.
- `<!-- exit: N -->` before a runnable block: its expected exit status (default 0).
- `<!-- timeout: S -->`: seconds it may take (default 240).
- `<!-- skip: REASON -->`: a runnable block that is not run here, and why (`make test` itself).
- `<!-- covered-by: tests/integration/test_x.py::test_y -->`: a runnable block that an
  integration test runs with the same command; test_docs.py checks that the test exists and
  runs the block's labctl subcommands, so the docs' own run stays short.
- `<!-- excerpt-of: PATH -->`: a block shortened from a file that the suite runs (a test module):
  test_docs.py checks that each of its lines is a line of that file, in the same order.
- `<!-- invisible-code-block: python ... -->` after a block: Python checks on what it printed
  (`output`, `summary`: its SUMMARY line parsed, `exit_status`), not shown on the site.

The lab: every labctl command here runs against the lab named in DDPLAB_LAB, which the tests set to
a name of their own, and the output is compared after that name is put back to the default
`ddplab` the pages show (and this checkout's path and this machine's name to those the outputs were
made with: normalize()).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from sybil import Document, Region
from sybil.evaluators.python import PythonEvaluator
from sybil.parsers.abstract import AbstractCodeBlockParser
from sybil.parsers.markdown.lexers import (
    DirectiveInHTMLCommentLexer,
    RawFencedCodeBlockLexer,
)

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = ("README.md", "docs/tutorial.md", "docs/how-to/real-repository.md")
SHELL = ("bash", "sh", "shell")
RUNNABLE = (*SHELL, "python")
DEFAULT_TIMEOUT_S = 240
DEFAULT_LAB = "ddplab"
COLUMNS = "200"  # the width the pages' tables were printed at (labctl's own for piped output)
SHOWN_CHECKOUT = "/work/main"  # where the pages' outputs were made
SHOWN_HOST = "vm"  # and on which machine

FENCES = RawFencedCodeBlockLexer(info_pattern=re.compile(r"(?P<info>[^\n]*)$\n", re.MULTILINE))
DIRECTIVE = re.compile(r"[ \t]*<!--\s*(?P<name>[\w-]+):\s*(?P<args>.*?)\s*-->[ \t]*$")
DIRECTIVES = ("output", "exit", "timeout", "skip", "covered-by", "excerpt-of")
COMMENT = re.compile(r"[ \t]*<!--.*-->[ \t]*$")  # any other one-line comment (a snippet marker) is passed over
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
NUMBER = re.compile(r"((?:(?<![\w.])[-+])?\d+(?:[.,]\d+)*)")  # with its sign, where it has one
# A run's folder (any run stands for any other) and a checksum of 16 hex digits (SUMMARY's
# param_checksum: a number too, whose last digits follow the CPU's maker; see same-numbers.md).
IDS = re.compile(r"\d{8}-\d{6}-[0-9a-f]{4}|(?<=\")[0-9a-f]{16}(?=\")")
RULES = re.compile(r"([ ─━═])\1+")


@dataclass
class Block:
    """A runnable block and what the page says about it."""
    path: str                 # relative to the repository
    line: int                 # of the opening fence
    language: str
    source: str
    output: str | None = None  # the ```text block shown after it
    output_line: int | None = None
    mode: str = "pattern"
    exit: int = 0
    timeout_s: float = DEFAULT_TIMEOUT_S
    skip: str | None = None
    covered_by: list[str] = field(default_factory=list)
    excerpt_of: str | None = None  # a file the block shortens, line for line

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def runs_here(self) -> bool:
        return self.skip is None and not self.covered_by and self.excerpt_of is None


@dataclass
class Fence:
    start: int
    end: int
    line: int
    language: str
    source: str


@dataclass
class Tally:
    """What the session did with the pages' blocks, for the line at its end."""
    ran: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    compared: int = 0
    checks: int = 0

    def add(self, block: Block, seconds: float, compared: bool) -> None:
        self.ran[block.path] = self.ran.get(block.path, 0) + 1
        self.seconds += seconds
        self.compared += compared


TALLY = Tally()


def fences(document: Document) -> list[Fence]:
    found = []
    for region in FENCES(document):
        info = region.lexemes["info"].strip()
        found.append(Fence(region.start, region.end, document.text.count("\n", 0, region.start) + 1,
                           info.split()[0] if info else "", str(region.lexemes["source"])))
    return sorted(found, key=lambda f: f.start)


def directives_before(text: str, start: int) -> dict[str, str]:
    """The `<!-- name: args -->` lines right above a fence (blank lines between are fine)."""
    found: dict[str, str] = {}
    lines = text[:start].split("\n")[:-1]  # the last piece is the fence line's own indent
    for line in reversed(lines):
        if not line.strip():
            continue
        match = DIRECTIVE.fullmatch(line)
        if match and match["name"] in DIRECTIVES:
            found.setdefault(match["name"], match["args"])
        elif not COMMENT.fullmatch(line):
            break
    return found


def between_is_blank(text: str, start: int, end: int) -> bool:
    """Nothing but blank lines and `<!-- output: ... -->` between two blocks."""
    for line in text[start:end].split("\n"):
        if line.strip() and not (DIRECTIVE.fullmatch(line) and DIRECTIVE.fullmatch(line)["name"] == "output"):
            return False
    return True


class BlockParser:
    """Sybil parser: a Region for each runnable block, carrying its Block; display blocks give none."""

    def __init__(self, path: str):
        self.path = path
        self.blocks: list[Block] = []
        self.display: list[Fence] = []
        self.unlabelled: list[Fence] = []

    def __call__(self, document: Document):
        found = fences(document)
        for i, fence in enumerate(found):
            if fence.language not in RUNNABLE:
                (self.display if fence.language else self.unlabelled).append(fence)
                continue
            said = directives_before(document.text, document.text.rfind("\n", 0, fence.start) + 1)
            block = Block(self.path, fence.line, fence.language, fence.source,
                          exit=int(said.get("exit", 0)), timeout_s=float(said.get("timeout", DEFAULT_TIMEOUT_S)),
                          skip=said.get("skip"),
                          covered_by=said["covered-by"].split() if "covered-by" in said else [],
                          excerpt_of=said.get("excerpt-of"))
            after = found[i + 1] if i + 1 < len(found) else None
            if after is not None and after.language == "text" and between_is_blank(document.text, fence.end, after.start):
                block.output, block.output_line = after.source, after.line
                shown_mode = directives_before(document.text, document.text.rfind("\n", 0, after.start) + 1).get("output")
                block.mode = shown_mode or "pattern"
                if block.mode not in ("exact", "pattern"):
                    raise ValueError(f"{self.path}:{after.line}: output: {block.mode}? (exact or pattern)")
            self.blocks.append(block)
            yield Region(fence.start, fence.end, block, run_block)


def checks_parser() -> AbstractCodeBlockParser:
    """`<!-- invisible-code-block: python ... -->`: checks in the page's namespace, not shown."""
    return AbstractCodeBlockParser([DirectiveInHTMLCommentLexer(directive="invisible-code-block", arguments="python")],
                                   "python", PythonEvaluator())


def parse(path: str) -> tuple[Document, BlockParser]:
    blocks = BlockParser(path)
    return Document.parse(str(REPO / path), blocks, checks_parser()), blocks


# ------------------------------------------------------------------------------------ running

def environment(lab: str) -> dict[str, str]:
    """What a block runs with: the reader's shell after `source .venv/bin/activate`, on the tests' lab."""
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "VIRTUAL_ENV": str(REPO / ".venv"),
            "DDPLAB_LAB": lab, "COLUMNS": COLUMNS, "TERM": "dumb", "NO_COLOR": "1", "PYTHONUNBUFFERED": "1"}


def run_source(block: Block, lab: str) -> tuple[int, str, float]:
    """Run the block as written: bash for shell (stopping at the first failing command), the
    venv's python for Python; stdout and stderr together, as a terminal shows them."""
    if block.language in SHELL:
        argv = ["bash", "-e", "-o", "pipefail", "-c", block.source]
    else:
        argv = [sys.executable, "-c", block.source]
    started = time.monotonic()
    # The block's TMPDIR goes with it: what it leaves there (torchrun's /tmp/torchelastic_* logs from
    # the tutorial's one-machine step, which a reader's own machine keeps) is not left by the tests.
    with tempfile.TemporaryDirectory(prefix="ddplab-docblock-") as scratch:
        try:
            done = subprocess.run(argv, cwd=REPO, env={**environment(lab), "TMPDIR": scratch}, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  timeout=block.timeout_s, check=False)
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            raise AssertionError(f"{block.id}: still running after {block.timeout_s:.0f} s:\n{out}") from None
    return done.returncode, normalize(done.stdout, lab), time.monotonic() - started


def normalize(output: str, lab: str) -> str:
    """Colours out, trailing spaces off, and what names this run's surroundings put back as the pages
    show them: the tests' lab name as the default `ddplab`, this checkout's path as the one the
    outputs were made in (SHOWN_CHECKOUT), and this machine's name in the trainer's `[rank R/W HOST]`
    prefix as SHOWN_HOST."""
    output = ANSI.sub("", output)
    if lab != DEFAULT_LAB:
        output = re.sub(rf"(?<![\w.-]){re.escape(lab)}(?![\w])", DEFAULT_LAB, output)
    output = output.replace(str(REPO), SHOWN_CHECKOUT)
    output = re.sub(rf"(\[rank \d+/\d+ ){re.escape(socket.gethostname())}\]", rf"\g<1>{SHOWN_HOST}]", output)
    return "\n".join(line.rstrip() for line in output.splitlines())


def summary_of(output: str) -> dict | None:
    """The trainer's SUMMARY line, parsed (the last one), or None."""
    found = [line.split("SUMMARY ", 1)[1] for line in output.splitlines() if "SUMMARY {" in line]
    return json.loads(found[-1]) if found else None


def run_block(example) -> None:
    """Sybil evaluator for a runnable block: run it, check its exit status and its shown output, and
    leave what it printed in the page's namespace for the checks after it."""
    block: Block = example.parsed
    namespace = example.namespace
    if not block.runs_here:
        return
    lab = namespace["lab"]
    status, output, seconds = run_source(block, lab)
    namespace.update(output=output, exit_status=status, summary=summary_of(output))
    TALLY.add(block, seconds, block.output is not None)
    if status != block.exit:
        raise AssertionError(f"{block.id}: exit status {status}, the page expects {block.exit}:\n{output}")
    if block.output is not None:
        problem = compare(block.output, output, block.mode)
        if problem:
            raise AssertionError(f"{block.id}: the output shown at line {block.output_line} ({block.mode}) is not "
                                 f"what ran: {problem}\n--- what ran:\n{output}")


# ---------------------------------------------------------------------------------- comparing

def line_pattern(line: str, numbers: bool) -> str:
    """A regex for one shown line: `...` is any text; with `numbers`, any number for a number and
    any run of spaces or rules for one (the line is normalized the same way first)."""
    parts = []
    for i, piece in enumerate(line.split("...")):
        if i:
            parts.append(".*?")
        if numbers:
            for j, chunk in enumerate(IDS.split(piece)):
                if j:
                    parts.append(f"(?:{IDS.pattern})")
                parts.append("".join(r"[-+]?\d+(?:[.,]\d+)*" if NUMBER.fullmatch(t) else re.escape(t)
                                     for t in NUMBER.split(chunk) if t))
        else:
            parts.append(re.escape(piece))
    return "".join(parts)


def collapse(line: str) -> str:
    return RULES.sub(r"\1", line)


def compare(shown: str, actual: str, mode: str) -> str | None:
    """None when `actual` is what `shown` says; else what differs."""
    shown_lines = [line.rstrip() for line in shown.rstrip("\n").split("\n")]
    actual_lines = actual.rstrip("\n").split("\n") if actual.strip() else []
    if mode == "exact":
        pattern = "".join(r"(?:[^\n]*\n)*?" if line.strip() == "..." else line_pattern(line, False) + r"\n"
                          for line in shown_lines)
        if re.fullmatch(pattern, "".join(line + "\n" for line in actual_lines)):
            return None
        for i, line in enumerate(shown_lines):  # the first line that does not match, for the message
            if line.strip() != "..." and not any(re.fullmatch(line_pattern(line, False), a) for a in actual_lines):
                return f"line {i + 1} shown, {line!r}, is not in the output"
        return "the lines are all there, but not in the order shown"
    elastic = any(line.strip() == "..." for line in shown_lines)
    wanted = [line for line in shown_lines if line.strip() != "..."]
    unused = [collapse(line) for line in actual_lines]
    for line in wanted:
        regex = re.compile(line_pattern(collapse(line), True))
        hit = next((i for i, a in enumerate(unused) if a is not None and regex.fullmatch(a)), None)
        if hit is None:
            return f"no line of the output is like {line!r}"
        unused[hit] = None
    left = [a for a in unused if a is not None]
    if left and not elastic:
        return f"{len(left)} line(s) of output not shown and no `...` line to stand for them, first {left[0]!r}"
    return None


def main(argv: list[str]) -> int:
    """`python tests/docs/docblocks.py PAGE [--lab NAME] [--lines A:B]`: run a page's blocks (those
    between lines A and B) as the tests do, printing each one's output as the page should show it
    and whether it matches: how a page's outputs are made and remade."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("page")
    parser.add_argument("--lab", default="docs-show")
    parser.add_argument("--lines", default=":")
    args = parser.parse_args(argv)
    low, _, high = args.lines.partition(":")
    document, _ = parse(args.page)
    document.namespace["lab"] = args.lab
    failed = 0
    for example in document.examples():
        if not (int(low or 0) <= example.line <= int(high or 10**9)):
            continue
        block = example.parsed if isinstance(example.parsed, Block) else None
        if block is not None and not block.runs_here:
            print(f"=== {block.id} not run here: {block.skip or block.excerpt_of or 'covered by ' + ' '.join(block.covered_by)}")
            continue
        started = time.monotonic()
        try:
            example.evaluate()
            verdict = "ok"
        except Exception as exc:  # noqa: BLE001 - printed for the writer, who reads on
            verdict = f"FAILED: {str(exc).split(chr(10) + '--- what ran:')[0]}"
            failed += 1
        if block is not None:
            print(f"=== {block.id} ({block.language}, exit {document.namespace.get('exit_status')}, "
                  f"{time.monotonic() - started:.1f} s): {verdict}")
            print(document.namespace.get("output", ""))
        else:
            print(f"=== check at {args.page}:{example.line}: {verdict}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
