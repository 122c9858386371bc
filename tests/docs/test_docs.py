"""The documentation's examples, executed: every ```bash and ```python block of README.md,
docs/tutorial.md and docs/how-to/real-repository.md runs against a real lab, in the order of the
page, and the output each page shows under a block is compared with what it printed (docblocks.py
has the conventions).

The library is Sybil: it lexes Markdown the way CommonMark does (fences in list items, HTML-comment
directives, `invisible-code-block` checks), evaluates each page's examples in order in one namespace
so that a check can read what the block before it printed, and names the page and line of every
failure; it is maintained and has no dependencies. pytest-codeblocks runs blocks one by one with no
namespace shared between them and its own output syntax; pytest-examples is for Python alone.

Blocks that would take minutes here (a scenario, a node lost mid-run, a Slurm lab) are run by an
integration test instead, which the block names (`<!-- covered-by: ... -->`); the tests below check
that each such test exists and runs the labctl commands and options the block shows.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from docblocks import DOCUMENTS, REPO, RUNNABLE, TALLY, Block, compare, environment, parse

PAGES = {path: parse(path) for path in DOCUMENTS}
COVERED = sum(1 for _, parser in PAGES.values() for b in parser.blocks if b.covered_by)
READ_ONLY = {"logs", "status", "ls"}  # reading what a run left does not change what a block covers
GROUPS = {"bench", "fault", "hosts", "scenario", "slurm"}  # commands whose second word is the command


def items():
    """Every example the session evaluates, page by page in order: the blocks that run here and the
    checks after them."""
    for path, (document, _) in PAGES.items():
        for example in document.examples():
            block = example.parsed if isinstance(example.parsed, Block) else None
            if block is not None and not block.runs_here:
                continue
            kind = block.language if block else "check"
            # alone: the tutorial's outputs are measurements (busbw at the wire, fp16 halving the
            # all-reduce, the straggler): beside another test's load, fp16's all-reduce once came out no
            # faster. The README's block checks no number: it runs beside the other tests (on a lab of
            # its own, the fixture being the module's in each of the two pytest runs).
            marks = [pytest.mark.integration] + ([pytest.mark.alone] if Path(path).name == "tutorial.md" else [])
            if block is not None:
                marks.append(pytest.mark.timeout(block.timeout_s + 60))
            yield pytest.param(example, id=f"{Path(path).name}:{example.line}-{kind}", marks=marks)


class Tallied:
    """The line at the end of the session: how many of the pages' blocks ran (registered by the
    fixture, so it says nothing in a session that ran none; no conftest.py here, whose module name
    would shadow tests/integration's `from conftest import ...` when both folders are named). In an
    xdist worker it goes to the controller, which prints it (tests/conftest.py)."""

    @staticmethod
    def line() -> str:
        pages = ", ".join(f"{count} of {page}" for page, count in TALLY.ran.items())
        return (f"docs: ran {sum(TALLY.ran.values())} blocks ({pages}) against a real lab in {TALLY.seconds:.0f} s; "
                f"{TALLY.compared} of them compared with the output the page shows, {TALLY.checks} checks after them; "
                f"{COVERED} more run by the integration tests they name")

    @staticmethod
    def pytest_terminal_summary(terminalreporter):
        if TALLY.ran:
            terminalreporter.write_line(Tallied.line())

    @staticmethod
    def pytest_sessionfinish(session):
        if TALLY.ran and hasattr(session.config, "workeroutput"):
            session.config.workeroutput.setdefault("summary_lines", []).append(Tallied.line())


# Where each page begins: the README reads as after `make demo` (a 3-node lab up), the tutorial and
# "Run a real repository" from no lab at all (their first blocks bring one up). The tutorial runs in
# the `alone` pytest of `make test`, the other two, one after the other, beside the other modules.
PAGE_START = {"README.md": ("up", "--nodes", "3"), "tutorial.md": ("down",), "real-repository.md": ("down",)}


@pytest.fixture(scope="module")
def docs_lab(request):
    """labctl for a lab named doc<random>, which each page's first example finds as the page begins
    (PAGE_START), and which is gone (volumes too, and its folder under .lab/) after the last. A
    missing engine or node image fails here: `make test` provides both."""
    import docker

    from labctl.spec.labspec import resolve_config

    if not request.config.pluginmanager.is_registered(Tallied):
        request.config.pluginmanager.register(Tallied)
    try:
        docker.from_env().ping()
    except Exception as exc:  # noqa: BLE001 - any failure here means no engine
        pytest.fail(f"the docs' examples run against a real lab and need a Docker engine ({exc}); `make test` starts one",
                    pytrace=False)
    tag = resolve_config(environ=os.environ).image_tag
    try:
        docker.from_env().images.get(tag)
    except Exception:  # noqa: BLE001
        pytest.fail(f"node image {tag} is missing; `make test` builds it (or `labctl build`)", pytrace=False)
    # As long as the pages' `ddplab`, so that labctl wraps its long lines where the pages show them.
    name = f"doc{uuid.uuid4().hex[:3]}"

    def labctl(*args: str, check: bool = False) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, "-m", "labctl", *args, "--lab", name], cwd=REPO, env=environment(name),
                              capture_output=True, text=True, timeout=300, check=False)
        assert not check or done.returncode == 0, f"labctl {' '.join(args)}: {done.stdout}{done.stderr}"
        return done

    labctl.name = name
    try:
        yield labctl
    finally:
        labctl("down", "--volumes")
        shutil.rmtree(REPO / ".lab" / name, ignore_errors=True)


@pytest.mark.parametrize("example", list(items()))
def test_example(example, docs_lab):
    if "lab" not in example.namespace:  # the page's first example: the lab as the page begins
        docs_lab(*PAGE_START[Path(example.path).name], check=True)
    example.namespace["lab"] = docs_lab.name
    example.evaluate()
    if not isinstance(example.parsed, Block):
        TALLY.checks += 1


def test_a_pattern_takes_any_checksum_for_a_checksum_and_nothing_else_for_a_word():
    """A gpt run's checksum follows the CPU's maker (same-numbers.md), as its times follow the machine."""
    shown = 'SUMMARY {"final_loss": 3.413775682449341, "param_checksum": "ce8bd364e4ca2c9c", "ok": true}'
    ran = 'SUMMARY {"final_loss": 3.41, "param_checksum": "f8cc5e04feddb9de", "ok": true}'
    assert compare(shown, ran, "pattern") is None
    assert compare(shown, ran.replace("true", "false"), "pattern") is not None
    assert compare(shown, ran.replace("f8cc5e04feddb9de", "f8cc5e04"), "pattern") is not None
    assert compare(shown, ran, "exact") is not None


# ------------------------------------------------------------------------------ the pages' shape

def blocks(path: str) -> list[Block]:
    return PAGES[path][1].blocks


def test_every_block_says_what_it_is_and_every_runnable_one_is_run_or_says_why_not():
    for path, (_, parser) in PAGES.items():
        assert not parser.unlabelled, (f"{path}: fences without a language at lines "
                                       f"{[f.line for f in parser.unlabelled]}: say ```text for output, or the language")
        for block in parser.blocks:
            assert block.language in RUNNABLE
            said = [block.runs_here, block.skip is not None, bool(block.covered_by), block.excerpt_of is not None]
            assert said.count(True) == 1, f"{block.id}: run, skip, covered-by or excerpt-of: one of them"
            assert block.skip is None or len(block.skip) > 10, f"{block.id}: skip says why"


def test_the_tutorial_has_at_least_12_steps_each_with_a_command_its_output_and_its_lesson():
    text = (REPO / "docs/tutorial.md").read_text()
    steps = re.split(r"^## (?=\d+\. )", text, flags=re.MULTILINE)[1:]
    assert len(steps) >= 12, f"{len(steps)} steps"
    by_line = {b.line: b for b in blocks("docs/tutorial.md")}
    start = text.index(steps[0])
    for step in steps:
        title = step.splitlines()[0]
        first, last = text.count("\n", 0, start) + 1, text.count("\n", 0, start + len(step)) + 1
        mine = [b for line, b in by_line.items() if first <= line <= last]
        assert any(b.output is not None for b in mine), f"step {title!r}: no command with its output shown"
        assert "What it teaches" in step or "what it teaches" in step, f"step {title!r}: no lesson"
        start += len(step) + len("## ")


# -------------------------------------------------------------------------- covered and excerpted

def names_in(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
        n.arg for n in ast.walk(node) if isinstance(n, ast.arg)}


def module_defs(path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """A module's top-level functions and assignments by name (their source), and the names it takes
    from `conftest`."""
    text = path.read_text()
    tree = ast.parse(text)
    defs, from_conftest = {}, {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defs[node.name] = ast.get_source_segment(text, node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in names_in(target):
                    defs[name] = ast.get_source_segment(text, node)
        elif isinstance(node, ast.ImportFrom) and node.module == "conftest":
            from_conftest.update({alias.asname or alias.name: alias.name for alias in node.names})
    return defs, from_conftest


def covering_source(reference: str) -> str:
    """The covering test's source, with everything of its module (and its directory's conftest) it
    uses: the helpers, fixtures and constants that make up the command it runs."""
    file, _, name = reference.partition("::")
    path = REPO / file
    assert path.is_file(), f"{reference}: no such file"
    defs, from_conftest = module_defs(path)
    assert name.split("[")[0] in defs, f"{reference}: no test {name} in {file}"
    conftest = path.parent / "conftest.py"
    shared = module_defs(conftest)[0] if conftest.is_file() else {}
    seen, todo, parts = set(), [name.split("[")[0]], []
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        source = defs.get(current) or (shared.get(from_conftest[current]) if current in from_conftest else None)
        if source:
            parts.append(source)
            todo.extend(names_in(ast.parse(source)))
    return "\n".join(parts)


def shell_lines(source: str) -> list[str]:
    """A shell block's commands, one per line, a line continued with a trailing backslash joined."""
    return source.replace("\\\n", " ").splitlines()


def labctl_commands(source: str) -> list[list[str]]:
    """Each labctl command of a shell block, its words up to `--` (the script's own arguments after
    it are the trainer's, not labctl's)."""
    commands = []
    for line in shell_lines(source):
        words = shlex.split(line, comments=True)
        for i, word in enumerate(words):
            if word == "labctl" or word.endswith("/labctl"):
                rest = words[i + 1:]
                end = next((j for j, w in enumerate(rest) if w in ("--", "&", "&&", "||", ";", "|")), len(rest))
                commands.append(rest[:end])
    return commands


def covered() -> list[tuple[Block, str]]:
    return [(b, ref) for path in PAGES for b in blocks(path) for ref in b.covered_by]


@pytest.mark.parametrize("block, reference", covered(), ids=[f"{b.id}" for b, _ in covered()])
def test_a_covered_block_names_a_test_that_runs_its_commands(block, reference):
    source = covering_source(reference)
    quoted = set(re.findall(r"\"([^\"]*)\"|'([^']*)'", source))
    strings = {s for pair in quoted for s in pair if s} | {w for s in [source] for w in re.findall(r"[\w./-]+", s)}
    commands = labctl_commands(block.source) if block.language != "python" else []
    for words in commands:
        if not words or words[0] in READ_ONLY:
            continue
        wanted = words[:2] if words[0] in GROUPS and len(words) > 1 else words[:1]
        wanted += [w.split("=")[0] for w in words if w.startswith("-")]
        missing = [w for w in wanted if w not in strings]
        assert not missing, f"{block.id}: {reference} does not run `labctl {' '.join(words)}`: no {missing} in its source"
    if not commands:  # another program: the test names what the block runs
        paths = [w for line in shell_lines(block.source) for w in shlex.split(line, comments=True) if "/" in w]
        for word in paths:
            assert Path(word).name in strings, f"{block.id}: {reference} does not mention {word}"


def test_an_excerpt_is_its_file_shortened_line_for_line():
    excerpts = [b for path in PAGES for b in blocks(path) if b.excerpt_of]
    for block in excerpts:
        lines = (REPO / block.excerpt_of).read_text().splitlines()
        at = 0
        for line in block.source.splitlines():
            if not line.strip():
                continue
            try:
                at = lines.index(line, at) + 1
            except ValueError:
                raise AssertionError(f"{block.id}: {line!r} is not a line of {block.excerpt_of} (after its line {at})") from None
