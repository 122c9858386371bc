"""labctl's layers, read from the code's own imports: no import cycle, no import that runs up the
layers, and function-level imports only where they defer something heavy. The picture in the
design docs (docs/explanation/design.md) is this table; this test keeps it true.

And what `labctl` imports before a command runs stays light: the group finds each command's module
in COMMAND_MODULES (every command must be listed there), the command modules import nothing heavy,
and the renderers, which import rich, come through labctl.cli.lazy alone.
"""

import ast
import functools
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "labctl"

# Top to bottom: a unit may import units below it, never one above it or beside it in its own row.
LAYERS = [
    ("pytest_plugin", "__main__"),
    ("cli",),
    ("api",),  # the upper layer: Lab and Hosts, the one bring-up, the scenarios' runs
    ("bench",),
    ("hosts",),
    ("diagnose",),
    ("trace",),  # `labctl trace`: a run's ranks on one time axis (diagnose and bench draw with it)
    ("slurm", "k8s"),  # the lab as a Slurm cluster; the lab and Kubernetes
    ("session",),  # a lab and its runs: above lab and run, which know nothing of each other
    ("run",),
    ("net",),
    ("lab",),  # the lab itself: its Compose document, env files, bring-up, listing and teardown
    ("image",),  # what nodes run: the node image, its base and wheelhouse, a lab's packages locked and layered
    ("engine",),  # Docker and Compose: the client, engine discovery and refusals, names and labels
    ("remote",),  # programs shipped into nodes: the standard library only
    ("spec", "core"),  # the lab spec and the syntax of its settings; the plumbing every layer uses
    ("errors",),
    ("labctl",),  # the package itself: __version__
]
RANK = {unit: i for i, row in enumerate(LAYERS) for unit in row}
HEAVY = {"docker", "rich", "yaml", "torch", "matplotlib", "numpy", "packaging", "jsonschema"}  # deferred to where they are used
# `labctl` runs labctl.cli.app:main, which loads each command's module when that command runs; the
# package's own `from labctl.cli import main` (every command loaded) must not defeat that. Nor may
# labctl.api's Workspace (the benches and the scenarios) weigh on every command that works on a lab.
LAZY_BY_DESIGN = {("labctl.cli", "__getattr__"), ("labctl.api", "__getattr__")}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "labctl"


@functools.cache  # parsed once a process (about a second), not once a test: the tests only read the trees
def modules() -> dict[str, ast.Module]:
    return {module_name(p): ast.parse(p.read_text(), str(p)) for p in sorted(ROOT.rglob("*.py"))}


def nodes_in_functions(tree: ast.Module) -> set[int]:
    """The ids of the nodes inside a function (a nested one's too), in one walk of the tree: walking
    every function's subtree again took most of this module's time."""
    inside, todo = set(), [(tree, False)]
    while todo:
        node, within = todo.pop()
        if within:
            inside.add(id(node))
        within = within or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        todo.extend((child, within) for child in ast.iter_child_nodes(node))
    return inside


def imports(name: str, tree: ast.Module, known: set[str]) -> list[tuple[str, int, bool]]:
    """(imported labctl module, line, inside a function) for every import statement of the module."""
    package = name if (ROOT.parent / name.replace(".", "/") / "__init__.py").exists() else name.rpartition(".")[0]
    in_function = nodes_in_functions(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            # `from labctl.x import y`: y is a module when labctl.x.y is one, else a name in labctl.x
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        found += [(t, node.lineno, id(node) in in_function) for t in targets]
    return found


def graph() -> dict[str, set[str]]:
    trees = modules()
    known = set(trees)
    edges: dict[str, set[str]] = defaultdict(set)
    for name, tree in trees.items():
        for target, _, _ in imports(name, tree, known):
            if target in known and target != name:
                edges[name].add(target)
    return edges


def test_every_unit_has_a_layer():
    assert {unit(name) for name in modules()} <= set(RANK)


def test_no_import_runs_up_the_layers():
    trees = modules()
    upward = []
    for name, tree in trees.items():
        for target, line, _ in imports(name, tree, set(trees)):
            if target.split(".")[0] != "labctl" or unit(target) == unit(name):
                continue
            if RANK[unit(target)] <= RANK[unit(name)]:
                upward.append(f"{name}:{line} imports {target} ({unit(name)} may only import units below it)")
    assert not upward, "\n".join(upward)


def test_no_import_cycle():
    edges = graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for node in list(edges):
        if node not in index:
            visit(node)
    assert not cycles, cycles


def heavy_modules(trees: dict[str, ast.Module]) -> set[str]:
    """labctl's modules that import a heavy dependency when they are imported (the renderers)."""
    heavy = set()
    for name, tree in trees.items():
        for node in tree.body:
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            if any(n.split(".")[0] in HEAVY for n in names):
                heavy.add(name)
    return heavy


def test_function_level_imports_only_defer_heavy_ones():
    """Everything else is imported at the top, where a reader sees what a module stands on."""
    trees = modules()
    heavy = heavy_modules(trees)
    light = []
    for name, tree in trees.items():
        if unit(name) == "remote":  # node programs: shipped as text, their own rules (labctl/remote/__init__.py)
            continue
        for fn in [f for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                   and (name, f.name) not in LAZY_BY_DESIGN]:
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    targets = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level:
                    targets = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
                else:
                    continue
                if not any(t.split(".")[0] in HEAVY or t in heavy for t in targets):
                    light.append(f"{name}:{node.lineno} imports {targets[0]} inside {fn.name}()")
    assert not light, "\n".join(light)


def python(code: str) -> str:
    """The standard output of `python -c CODE` in a fresh interpreter, which has imported nothing yet."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout


# Imported before a command runs: the package, the API and the pytest plugin, the group, and the
# module of each command (labctl.cli.app's COMMAND_MODULES), so a usage error or --help pays for none.
LIGHT = ["labctl.cli", "labctl.api", "labctl.pytest_plugin", "labctl.cli.app"]
FIND_HEAVY = """
import importlib, json, sys
from labctl.cli.app import COMMAND_MODULES
heavy = {heavy!r}
found = {{}}
for module in {light!r} + sorted(f"labctl.cli.{{m}}" for m in set(COMMAND_MODULES.values())):
    importlib.import_module(module)
    found[module] = sorted(h for h in heavy if h in sys.modules and not any(h in v for v in found.values()))
print(json.dumps(found))
"""


def test_importing_labctl_stays_light():
    """One process imports each module in turn; a heavy module is charged to the first import that
    loaded it, which is the one that would load it alone too."""
    found = json.loads(python(FIND_HEAVY.format(heavy=sorted(HEAVY), light=LIGHT)))
    heavy = [f"importing {module} imports {', '.join(names)}" for module, names in found.items() if names]
    assert not heavy, "\n".join(heavy) + (
        "\nImport a heavy module inside the function that uses it, not at a module's top. A renderer "
        "(labctl.cli.render*, which imports rich) is taken from labctl.cli.lazy instead: "
        "`from labctl.cli.lazy import render` at the top, imported at its first use.")


def test_renderers_are_imported_in_one_place():
    """The renderers import rich, so a command module takes them from labctl.cli.lazy, which imports
    each at its first use (test_importing_labctl_stays_light says why); only the renderers themselves
    import one another."""
    trees = modules()
    direct = []
    for name, tree in trees.items():
        if name == "labctl.cli.lazy" or name.startswith("labctl.cli.render"):
            continue
        for target, line, _ in imports(name, tree, set(trees)):
            if target.startswith("labctl.cli.render"):
                short = target.rpartition(".")[2]
                direct.append(f"{name}:{line} imports {target}: write `from labctl.cli.lazy import {short}` at the "
                              f"top of {name} instead (a new renderer gets its line in labctl/cli/lazy.py)")
    assert not direct, "\n".join(direct)


FIND_COMMANDS = """
import importlib, json, pkgutil
import labctl.cli
from labctl.cli.app import COMMAND_MODULES, main
before = sorted(main.commands)
for found in pkgutil.iter_modules(labctl.cli.__path__):
    importlib.import_module(f"labctl.cli.{found.name}")
defined = {name: getattr(command.callback, "__module__", None) for name, command in main.commands.items()}
print(json.dumps({"before": before, "listed": COMMAND_MODULES, "defined": defined}))
"""


def test_every_command_is_where_the_lazy_group_looks_for_it():
    """`labctl NAME` imports the module that COMMAND_MODULES in labctl/cli/app.py names for NAME, and
    no other: a command that list misses is never loaded. So every module of labctl.cli is imported
    here, and each command it defines must be in the list, under its module."""
    found = json.loads(python(FIND_COMMANDS))
    assert not found["before"], f"importing labctl.cli.app loaded commands {found['before']}: it must load none"
    listed, defined = found["listed"], found["defined"]
    wrong = []
    for name, module in sorted(defined.items()):
        short = (module or "").rpartition(".")[2]
        if name not in listed:
            wrong.append(f"`labctl {name}` is defined in {module}, and COMMAND_MODULES in labctl/cli/app.py does not "
                         f"list it, so `labctl {name}` is never loaded: add \"{name}\": \"{short}\" to COMMAND_MODULES")
        elif listed[name] != short:
            wrong.append(f"`labctl {name}` is defined in {module}, and COMMAND_MODULES in labctl/cli/app.py looks for it "
                         f"in labctl.cli.{listed[name]}: make its entry \"{name}\": \"{short}\"")
    wrong += [f"COMMAND_MODULES in labctl/cli/app.py lists `labctl {name}`, which labctl.cli.{module} does not define: "
              f"remove \"{name}\" there, or define the command" for name, module in sorted(listed.items())
              if name not in defined]
    assert not wrong, "\n".join(wrong)


def test_no_two_public_classes_share_a_name():
    """One name, one thing: a reader who meets `Verdict` or `Row` knows which one it is, in labctl and in
    the trainer that labctl imports (`trainer.dist.Compute`, `trainer.stepmodel.ComputeTimes`)."""
    where: dict[str, list[str]] = defaultdict(list)
    trainer = {f"trainer.{p.stem}": ast.parse(p.read_text(), str(p)) for p in sorted((ROOT.parent / "trainer").glob("*.py"))}
    for module, tree in {**modules(), **trainer}.items():
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                where[node.name].append(module)
    shared = {name: modules for name, modules in where.items() if len(modules) > 1}
    assert not shared, shared


def parameter_count(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    args = node.args
    named = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    return len(named) - (1 if named and named[0].arg in ("self", "cls") else 0)


def test_functions_read_at_a_glance():
    """No function of labctl over 50 lines or over 8 parameters, but click's command functions (each
    parses, calls and renders). A call with more to say takes one value (LabSpec, RunOptions)."""
    long = []
    for module, tree in modules().items():
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            command = any(isinstance(d, ast.Call) and getattr(d.func, "attr", "") in ("command", "group")
                          for d in node.decorator_list)
            name = f"{module}.{node.name}"
            if not command and node.end_lineno - node.lineno + 1 > 50:
                long.append(f"{name}: {node.end_lineno - node.lineno + 1} lines")
            if not command and parameter_count(node) > 8:
                long.append(f"{name}: {parameter_count(node)} parameters")
    assert not long, "\n".join(long)


# What a command module may import: the API, the CLI's own modules, and the leaves (the spec and its
# syntax, the plumbing, the errors). Renderers may import the types and formatters they render.
COMMAND_REACH = ("labctl.api", "labctl.cli", "labctl.spec", "labctl.core", "labctl.errors")


def test_commands_reach_the_library_through_the_api():
    trees = modules()
    beyond = []
    for name, tree in trees.items():
        if not name.startswith("labctl.cli.") or name.rpartition(".")[2].startswith("render"):
            continue
        for target, line, _ in imports(name, tree, set(trees)):
            if target.startswith("labctl.") and not target.startswith(tuple(f"{m}." for m in COMMAND_REACH)) \
                    and target not in COMMAND_REACH:
                beyond.append(f"{name}:{line} imports {target} (commands go through labctl.api)")
    assert not beyond, "\n".join(beyond)
