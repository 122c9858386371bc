"""The one way labctl runs an external command: argv lists, logged, failures raised with their output."""

from __future__ import annotations

import json
import logging
import shlex
import subprocess
from pathlib import Path

from labctl.errors import CommandError

log = logging.getLogger("labctl.core.proc")


def run(argv: list[str], *, cwd: Path | None = None, check: bool = True, capture: bool = True,
        timeout_s: float | None = None, env: dict[str, str] | None = None,
        input_text: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run argv (never a shell string), with `input_text` on its stdin if given.
    Raises CommandError with the command, status and output."""
    log.debug("$ %s", shlex.join(argv))
    try:
        result = subprocess.run(argv, cwd=cwd, text=True, capture_output=capture, timeout=timeout_s, env=env,
                                input=input_text)
    except FileNotFoundError:
        raise CommandError(argv, 127, stderr=f"{argv[0]}: command not found") from None
    except subprocess.TimeoutExpired as exc:
        raise CommandError(argv, 124, stderr=f"timed out after {timeout_s} s\n{exc.stderr or ''}") from None
    if check and result.returncode != 0:
        raise CommandError(argv, result.returncode, result.stdout or "", result.stderr or "")
    return result


def last_json_line(output: str) -> dict | None:
    """The report a script run in a node or on a host printed as its last JSON object line (what
    pip or Python said before it does not count), parsed; None where it printed none. A line that
    starts like JSON but is not raises ValueError (json's), as a broken report should."""
    line = next((ln for ln in reversed(output.strip().splitlines()) if ln.startswith("{")), "")
    return json.loads(line) if line else None
