"""What pip's refusals mean for a lab's packages, as the project's errors: bad input (exit 2, naming
the requirement, the file's line, what the index offers, or the node's platform) or no index to ask
(exit 1). Read off pip's own words; tests/unit/pip/ holds real ones.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Iterable

from labctl.errors import LabError, StateError
from labctl.image.packages import torch_refusal

if TYPE_CHECKING:
    from labctl.image.wheelhouse import Target

_NOT_FOUND = re.compile(r"Could not find a version that satisfies the requirement (\S+) \(from versions: ([^)]*)\)")
_BAD_LINE = re.compile(r"Invalid requirement: (.*?)(?:\n\s+.*?)*?\(from line (\d+) of (.+?)\)", re.S)
_DEPENDS = re.compile(r"^\s*(\S+) (\S+) depends on torch(\S*)", re.M)
_USER_TORCH = re.compile(r"^\s*The user requested torch(\S+)$", re.M)
_CONFLICT = re.compile(r"The conflict is caused by:\n((?:[ \t]+\S.*\n?)+)")
# What pip's warnings say when no index answered (it retries, and says why, before giving up).
UNREACHABLE = ("after connection broken by", "Failed to establish a new connection", "NewConnectionError",
               "NameResolutionError", "Max retries exceeded", "Temporary failure in name resolution",
               "Name or service not known", "Network is unreachable", "ProxyError", "ConnectTimeout",
               "Could not fetch URL")


def explain_pip_failure(output: str, target: Target, pinned: str, cached: Iterable[str] = ()) -> LabError | None:
    """What pip's refusal to resolve (its stdout and stderr) means for the user, as the project's
    error: bad input (exit 2) or no index to ask (exit 1); None where pip said something else."""
    if any(marker in output for marker in UNREACHABLE):
        wanted = sorted({match[0] for match in _NOT_FOUND.findall(output)}) or ["the packages"]
        have = sorted(cached)
        shown = f"the wheels cached here: {', '.join(have[:12])}; " if have else ""
        return StateError(f"no package index answers, and no cached wheel has {', '.join(wanted)} for the nodes "
                          f"({target.describe()})",
                          hint=f"{shown}check pip's index (PIP_INDEX_URL, pip.conf) and the network; a lock resolved "
                               "before works offline from its cached wheels")
    bad = _BAD_LINE.search(output)
    if bad:
        message = " ".join(bad.group(1).split())
        return LabError(f"{bad.group(3)} line {bad.group(2)}: {message}",
                        hint="one requirement per line, as pip takes them: NAME[EXTRAS][SPECIFIER][; MARKER]")
    conflict = torch_conflict(output, pinned)
    if conflict:
        return conflict
    found = _NOT_FOUND.search(output)
    if found:
        name, versions = found.group(1), [v.strip() for v in found.group(2).split(",") if v.strip()]
        if versions == ["none"] or not versions:
            return LabError(f"the package index has no wheel of {name} for the nodes ({target.describe()}): the name "
                            f"may be misspelt, or {name} publishes only source distributions or wheels for other "
                            "platforms", hint=f"check the name (`pip index versions {name}`); the nodes install "
                                              "wheels only")
        shown = ", ".join(versions[-6:])
        bare = re.split(r"[<>=!~;\[ ]", name, maxsplit=1)[0]
        return LabError(f"no version of {name} on the package index matches: it offers {len(versions)} versions, the "
                        f"latest {shown}", hint=f"ask for one of them, e.g. {bare}=={versions[-1]}")
    caused = _CONFLICT.search(output)
    if caused:
        lines = [" ".join(line.split()) for line in caused.group(1).splitlines() if line.strip()]
        return LabError("pip cannot satisfy the requirements together: " + "; ".join(lines),
                        hint="loosen one of them; `pip install --dry-run` of the same requirements shows the same")
    return None


def torch_conflict(output: str, pinned: str) -> LabError | None:
    """A requirement that needs another torch than the lab's, from pip's "conflict is caused by"."""
    if "conflict is caused by" not in output:
        return None
    for name, version, spec in _DEPENDS.findall(output):
        return torch_refusal(f"{name} {version} needs torch{spec}", pinned, f"torch{spec}")
    for spec in _USER_TORCH.findall(output):
        if spec != f"=={pinned}":
            return torch_refusal(f"the requirements ask for torch{spec}", pinned, f"torch{spec}")
    return None
