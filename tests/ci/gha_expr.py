"""GitHub Actions expressions, the part of them that tests/ci/run_workflow.py needs.

`${{ ... }}` in strings, and `if:` conditions: literals ('text', true, false, null, numbers),
context paths (steps.image-cache.outputs.cache-hit, env.NAME, runner.temp, github.sha), the
operators == != && || ! and parentheses, and the status functions success() failure() always()
cancelled(). Anything else is refused with ExpressionError rather than guessed at.
Semantics as documented at https://docs.github.com/en/actions/learn-github-actions/expressions:
== compares strings case-insensitively, && and || return an operand, a missing property is null.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping

STATUS_FUNCTIONS = ("success", "failure", "always", "cancelled")
_TOKEN = re.compile(r"""\s*(?:
    (?P<str>'(?:[^']|'')*')
  | (?P<num>-?\d+(?:\.\d+)?)
  | (?P<op>==|!=|&&|\|\||!|\(|\))
  | (?P<name>[A-Za-z_][A-Za-z0-9_-]*(?:\.[A-Za-z_*][A-Za-z0-9_-]*)*)
)""", re.VERBOSE)
_SUBSTITUTION = re.compile(r"\$\{\{(.*?)\}\}", re.DOTALL)


class ExpressionError(ValueError):
    pass


def tokenize(text: str) -> list[tuple[str, str]]:
    tokens, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if not match or match.end() == pos:
            raise ExpressionError(f"cannot read the expression {text!r} at {text[pos:]!r}")
        kind = match.lastgroup
        tokens.append((kind, match.group(kind)))
        pos = match.end()
    return tokens


class _Parser:
    """Recursive descent: or > and > not > comparison > primary."""

    def __init__(self, text: str, lookup: Callable[[str], Any], status: Mapping[str, bool]):
        self.text, self.tokens, self.pos = text, tokenize(text), 0
        self.lookup, self.status = lookup, status

    def parse(self) -> Any:
        value = self._or()
        if self.pos != len(self.tokens):
            raise ExpressionError(f"unexpected {self.tokens[self.pos][1]!r} in {self.text!r}")
        return value

    def _peek(self) -> str | None:
        return self.tokens[self.pos][1] if self.pos < len(self.tokens) else None

    def _take(self) -> tuple[str, str]:
        if self.pos >= len(self.tokens):
            raise ExpressionError(f"the expression {self.text!r} ends too early")
        self.pos += 1
        return self.tokens[self.pos - 1]

    def _or(self) -> Any:
        value = self._and()
        while self._peek() == "||":
            self._take()
            right = self._and()
            value = value if truthy(value) else right
        return value

    def _and(self) -> Any:
        value = self._not()
        while self._peek() == "&&":
            self._take()
            right = self._not()
            value = right if truthy(value) else value
        return value

    def _not(self) -> Any:
        if self._peek() == "!":
            self._take()
            return not truthy(self._not())
        return self._comparison()

    def _comparison(self) -> Any:
        value = self._primary()
        while self._peek() in ("==", "!="):
            op = self._take()[1]
            equal = loose_equal(value, self._primary())
            value = equal if op == "==" else not equal
        return value

    def _primary(self) -> Any:
        kind, text = self._take()
        if text == "(":
            value = self._or()
            if self._take()[1] != ")":
                raise ExpressionError(f"a '(' is not closed in {self.text!r}")
            return value
        if kind == "str":
            return text[1:-1].replace("''", "'")
        if kind == "num":
            return float(text)
        if kind != "name":
            raise ExpressionError(f"unexpected {text!r} in {self.text!r}")
        if self._peek() == "(":
            self._take()
            if self._take()[1] != ")" or text not in STATUS_FUNCTIONS:
                raise ExpressionError(f"function {text}(...) is not supported here (only {', '.join(STATUS_FUNCTIONS)}"
                                      f" with no arguments), in {self.text!r}")
            return self.status[text]
        literals = {"true": True, "false": False, "null": None}
        return literals[text] if text in literals else self.lookup(text)


def truthy(value: Any) -> bool:
    return value not in (None, False, "", 0, 0.0)


def loose_equal(a: Any, b: Any) -> bool:
    if isinstance(a, str) and isinstance(b, str):
        return a.lower() == b.lower()
    if type(a) is not type(b):  # GitHub coerces to numbers; the strings a workflow compares are enough here
        return str(text_of(a)).lower() == str(text_of(b)).lower()
    return a == b


def text_of(value: Any) -> str:
    """How a value reads when substituted into a string."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def context_lookup(contexts: Mapping[str, Any]) -> Callable[[str], Any]:
    """`name.a.b` -> contexts[name][a][b]; a missing property is null, an unknown context an error."""

    def lookup(path: str) -> Any:
        head, *rest = path.split(".")
        if head not in contexts:
            raise ExpressionError(f"context {head!r} is not available here (known: {', '.join(sorted(contexts))})")
        value = contexts[head]
        for part in rest:
            value = value.get(part) if isinstance(value, Mapping) else None
        return value

    return lookup


def evaluate(text: str, contexts: Mapping[str, Any], status: Mapping[str, bool] | None = None) -> Any:
    status = status or {name: False for name in STATUS_FUNCTIONS}
    return _Parser(text, context_lookup(contexts), status).parse()


def substitute(text: str, contexts: Mapping[str, Any]) -> str:
    """Every `${{ expr }}` in `text` replaced by its value."""
    return _SUBSTITUTION.sub(lambda m: text_of(evaluate(m.group(1), contexts)), text)


def condition(text: str | bool | None, contexts: Mapping[str, Any], job_failed: bool) -> bool:
    """An `if:` as GitHub reads it: `${{ }}` optional, and `success() && (...)` unless the
    condition calls a status function itself."""
    if text is None:
        text = "success()"
    if isinstance(text, bool):
        text = "true" if text else "false"
    text = str(text).strip()
    inner = _SUBSTITUTION.fullmatch(text)
    text = inner.group(1) if inner else text
    if not any(re.search(rf"\b{name}\s*\(", text) for name in STATUS_FUNCTIONS):
        text = f"success() && ({text})"
    status = {"success": not job_failed, "failure": job_failed, "always": True, "cancelled": False}
    return truthy(evaluate(text, contexts, status))
