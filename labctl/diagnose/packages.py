"""doctor's `packages` check: the version-mismatch trap, for every package and not only torch.

Every distribution each node's Python sees (name and version, from labctl/remote/node_info.py) is
compared with the lab's lock where it has one (.lab/<lab>/pylock.toml: labctl.image.packages), and
with the other nodes' in any case. A package a node lacks, has at another version, or has alone is
named with the node. torch is the `versions` check's (its CUDA build carries another local label and
the nvidia-* runtime, which is no drift), so the CUDA build's own packages are left to it too.

Pure: the findings from what the nodes reported.
"""

from __future__ import annotations

from collections import Counter
from typing import Mapping

from labctl.diagnose.findings import Finding
from labctl.image.lockfile import Lock, same_version
from labctl.image.packages import TORCH

CUDA_BUILD = ("nvidia-", "triton", "cuda-")  # what torch's CUDA build brings besides itself


def own_to_torch(name: str) -> bool:
    return name == TORCH or name.startswith(CUDA_BUILD)


def check_packages(info: Mapping[str, Mapping], lock: Lock | None, lock_path: str = "the lab's lock",
                   fix: str = "") -> list[Finding]:
    """Findings for the packages every node reported (`info[node]["packages"]`: name -> version)."""
    seen = {node: dict(i.get("packages") or {}) for node, i in info.items()}
    if not any(seen.values()):
        return []  # a node_info too old to list them: nothing to compare
    again = f" --requirements {lock_path}" if lock else ""
    fix = fix or (f"make the nodes again from the lab's image: `labctl down && labctl up{again}` (what was "
                  "installed into one node by hand lives in its container, which `down` removes)")
    out: list[Finding] = []
    pinned = {p.name: p.version for p in lock.pins if not own_to_torch(p.name)} if lock else {}
    for node, have in seen.items():
        for name, version in sorted(pinned.items()):
            got = have.get(name)
            if got is None:
                out.append(Finding("packages", node, False, f"{name} {version} is in {lock_path}, but {node}'s Python "
                                   "does not have it", fix))
            elif not same_version(got, version):
                out.append(Finding("packages", node, False, f"{name} {got} on {node}, {version} in {lock_path}: "
                                   "ranks that import different versions compute different things, or fail in "
                                   "unrelated-looking ways", fix))
    out += drift(seen, set(pinned), fix)
    if out:
        return out
    count = len(next(iter(seen.values())))
    if lock:
        return [Finding("packages", "all", True, f"{count} distributions on every node, as {lock_path} says "
                                                 f"({lock.short})")]
    return [Finding("packages", "all", True, f"the same {count} distributions on every node")]


def drift(seen: Mapping[str, Mapping[str, str]], checked: set[str], fix: str) -> list[Finding]:
    """Packages (not already held to the lock) that some node lacks or has at another version than most nodes."""
    out = []
    names = sorted({name for have in seen.values() for name in have} - checked)
    for name in (n for n in names if not own_to_torch(n)):
        versions = {node: have.get(name) for node, have in seen.items()}
        counts = Counter(versions.values())
        if len(counts) == 1:
            continue
        common, _ = counts.most_common(1)[0]
        others = [n for n, v in versions.items() if v == common]
        for node, version in versions.items():
            if version == common:
                continue
            if version is None:
                message = f"{name} {common} on {', '.join(others)}, but not on {node}"
            elif common is None:
                message = f"{name} {version} on {node} alone"
            else:
                message = f"{name} {version} on {node}, {common} on {', '.join(others)}"
            out.append(Finding("packages", node, False, message, fix))
    return out
