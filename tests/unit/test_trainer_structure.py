"""The trainer's shape: small functions, settings passed as records rather than long parameter lists."""

import ast
from pathlib import Path

import pytest

TRAINER = Path(__file__).resolve().parents[2] / "trainer"
MAX_PARAMS = 6


def functions(path):
    """(name, line, parameter count) of every function in the file; a method's self or cls not counted."""
    tree = ast.parse(path.read_text(), filename=str(path))
    methods = {id(f) for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for f in c.body
               if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, (a.vararg, a.kwarg))]
            static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in getattr(node, "decorator_list", []))
            if id(node) in methods and not static and params and params[0].arg in ("self", "cls"):
                params = params[1:]
            yield getattr(node, "name", "<lambda>"), node.lineno, len(params)


@pytest.mark.parametrize("path", sorted(TRAINER.glob("*.py")), ids=lambda p: p.name)
def test_no_function_takes_more_than_six_parameters(path):
    too_many = [f"{path.name}:{line} {name}() takes {n}" for name, line, n in functions(path) if n > MAX_PARAMS]
    assert not too_many, f"more than {MAX_PARAMS} parameters; pass a record (trainer/state.py) instead: {too_many}"


def test_the_counter_counts_every_kind_of_parameter(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("def f(a, /, b, *c, d, **e): pass\n"
                   "class K:\n    def m(self, a, b): pass\n    @staticmethod\n    def s(self, a): pass\n")
    assert sorted((name, n) for name, _, n in functions(src)) == [("f", 5), ("m", 2), ("s", 2)]
