"""What doctor reports: one Finding per check and node, gathered into a Diagnosis, and the refusal
a preflight raises. Below doctor and its checkers (doctor.py, gpus.py, slurm.py) and the hosts'
checks, which all speak in Findings.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from labctl.errors import StateError


@dataclass(frozen=True)
class Finding:
    check: str
    node: str  # a node's name, or "all"
    ok: bool
    message: str
    fix: str = ""
    warn: bool = False  # worth knowing, but a run works anyway (a deliberate straggler)

    @property
    def blocking(self) -> bool:
        return not self.ok and not self.warn

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Diagnosis:
    """What doctor found on a set of nodes (the lab's containers or real hosts): the same report
    for both, rendered by one function of the CLI and returned as-is by the Python API."""

    title: str  # what was checked, e.g. "lab demo: nodes"
    findings: list[Finding]
    nodes: dict[str, dict]  # per node: ip, torch, python, cuda, nccl, ifaces, the socket iface
    seconds: float

    @property
    def ok(self) -> bool:
        return not any(f.blocking for f in self.findings)

    @property
    def problems(self) -> list[Finding]:
        """Everything not right, warnings included."""
        return [f for f in self.findings if not f.ok]

    def as_dict(self) -> dict:
        return {"ok": self.ok, "seconds": round(self.seconds, 2), "nodes": self.nodes,
                "findings": [f.as_dict() for f in self.findings]}

    def raise_for_problems(self, full_check: str) -> None:
        """A preflight's verdict: refuse to start on a problem (warnings pass)."""
        bad = [f for f in self.findings if f.blocking]
        if bad:
            raise PreflightFailed(self, len(bad), full_check)


class PreflightFailed(StateError):
    """doctor's cheap checks found a problem before a run; the run was not started (the lab's or
    the hosts' state: exit status 1, as doctor's)."""

    def __init__(self, diagnosis: Diagnosis, count: int, full_check: str):
        super().__init__(f"preflight found {count} problem{'s' * (count != 1)}; the run was not started",
                         hint=f"`{full_check}` for the full check; --no-preflight to run anyway")
        self.diagnosis = diagnosis
