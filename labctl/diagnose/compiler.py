"""doctor's `compiler` check: every node can build torch.compile's CPU kernels. Inductor writes C++
and builds it with $CXX (else g++) against the node's Python headers; without either, a compiled
model fails at its first step with `InvalidCxxCompiler` (labctl/run/known.py explains it then).
Read from what the node reported (labctl/remote/node_info.py's compiler()); pure."""

from __future__ import annotations

from collections import Counter

from labctl.diagnose.findings import Finding

HOST_FIX = ("install them there (`apt-get install g++ python3-dev`, `dnf install gcc-c++ python3-devel`), or run "
            "the model eager (TORCHDYNAMO_DISABLE=1 in the job's environment)")
FIX = ("give the nodes an image with a C++ compiler and the Python headers (`labctl build` puts g++ and python3-dev "
       "in the lab's), or run the model eager (`labctl run -e TORCHDYNAMO_DISABLE=1 ...`)")


def check_compiler(info: dict[str, dict], fix: str = FIX) -> list[Finding]:
    """A warning per node that cannot build inductor's kernels (a run that does not compile works),
    and one where the nodes' compilers differ (their inductor caches then hold different entries)."""
    out = []
    reports = {node: i["compiler"] for node, i in info.items() if i.get("compiler")}
    for node, c in reports.items():
        missing = ([] if c.get("path") else [f"no C++ compiler ({c.get('cxx')} is not on its PATH)"]) + (
            [] if c.get("python_h") else ["no headers for its Python (Python.h)"])
        if missing:
            out.append(Finding("compiler", node, False,
                               f"cannot build torch.compile's kernels: {' and '.join(missing)}; a compiled "
                               "model fails there at its first step (InvalidCxxCompiler)", fix, warn=True))
    versions = {node: f"{c.get('cxx')} {c.get('version')}" for node, c in reports.items() if c.get("path")}
    counts = Counter(versions.values())
    if len(counts) > 1:
        common = counts.most_common(1)[0][0]
        out += [Finding("compiler", node, False, f"{shown} here, {common} on the other nodes: compiled kernels "
                        "differ between them", "run every node on one image (`labctl up` does)", warn=True)
                for node, shown in versions.items() if shown != common]
    if not out and versions:
        out.append(Finding("compiler", "all", True, f"{next(iter(versions.values()))} and the Python headers on "
                           "every node: torch.compile can build its kernels"))
    return out
