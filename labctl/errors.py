"""The project's error types. Only the CLI turns them into messages and exit statuses."""

from __future__ import annotations

import shlex


class LabError(Exception):
    """Something the user can fix: bad input or a state of the machine. Exit status 2.

    The message says what went wrong and the value given; `hint` says what to do.
    """

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


class StateError(LabError):
    """The machine or the lab is not in a state to do this (no engine, an engine a lab cannot run
    on, the lab not up): nothing was wrong with the input. Exit status 1."""

    exit_code = 1


class ConfigError(LabError):
    """A setting has a value outside what is allowed."""

    def __init__(self, key: str, value: object, allowed: str, source: str = "", hint: str | None = None):
        where = f" (from {source})" if source else ""
        super().__init__(f"invalid {key}={value!r}{where}: {allowed}", hint)
        self.key = key
        self.value = value


class CommandError(Exception):
    """An external command failed. Carries everything needed to see why (exit status 1)."""

    exit_code = 1

    def __init__(self, argv: list[str], returncode: int, stdout: str = "", stderr: str = ""):
        self.argv = argv
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        tail = (stderr or stdout).strip().splitlines()[-15:]
        detail = "\n    ".join(tail)
        super().__init__(f"`{shlex.join(argv)}` exited with status {returncode}" + (f":\n    {detail}" if detail else ""))


class RunFailed(Exception):
    """A training run ended badly on at least one node (exit status 1, 130 after Ctrl-C).

    `result` is the run's RunResult (every node's exit status, its lines, the logs) when the run got
    as far as starting; like subprocess.CalledProcessError, it travels with the error.
    """

    def __init__(self, message: str, exit_code: int = 1, result=None):
        super().__init__(message)
        self.exit_code = exit_code
        self.result = result
