"""`labctl doctor --ops`: what the lab's backend can do, tried on its nodes rather than read from a
table. trainer/probe_ops.py runs on every node (one rank each, the lab's own launcher) and calls
each c10d operation synchronously, asynchronously then `wait()`, and asynchronously then
`get_future()`, the reducing ones under every reduce op, and all_reduce on every dtype; rank 0
writes ops.json in the run's folder, which this module reads back as an OpsReport.

Pure: `OpsReport.from_dict`, `refusals` (the cells that are not ok, grouped as the report says
them). Side effect: `probe_ops` (a run on the lab).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from labctl.errors import StateError
from labctl.run.plan import RunOptions

PROBE_MODULE = "trainer.probe_ops"
REPORT_FILE = "ops.json"  # = trainer/probe_ops.py's, in the run's folder
OK, NA, WRONG = "ok", "n/a", "wrong"  # = trainer/probe_ops.py's
# NCCL's side of the comparison the report ends with, from NCCL's own header (ncclDataType_t,
# ncclRedOpCreatePreMulSum) and torch's ProcessGroupNCCL, not probed: no lab here has a GPU.
NCCL_DIFFERS = ("nccl (GPU nodes, not probed here): its works, point-to-point included, have futures; it takes "
                "PREMUL_SUM (NCCL 2.11 and later); its types are int8, uint8, int32, uint32, int64, uint64, "
                "float16, float32, float64, bfloat16 and, in recent releases, float8 (torch sends bool as "
                "uint8, complex as pairs of floats); monitored_barrier is gloo's only")


@dataclass(frozen=True)
class OpsReport:
    """One probe's table: the backend, device and torch release it ran with, and its cells."""

    backend: str
    device: str
    torch: str
    world_size: int
    modes: list[str]  # sync, async_wait, get_future
    reduce_ops: list[str]
    rows: list[dict[str, str]]  # {"op": name, mode or reduce op: cell}
    dtypes: dict[str, str]  # all_reduce's cell for each dtype
    run_dir: Path

    @classmethod
    def from_dict(cls, data: dict, run_dir: Path) -> OpsReport:
        return cls(data["backend"], data["device"], data["torch"], data["world_size"], data["modes"],
                   data["reduce_ops"], data["rows"], data["all_reduce_dtypes"], run_dir)

    def cell(self, op: str, column: str) -> str:
        row = next((r for r in self.rows if r["op"] == op), {})
        return row.get(column, NA)

    def refusals(self) -> list[tuple[str, list[str]]]:
        """What the backend would not do: (each distinct error, the places it came from), in the
        table's order."""
        where: dict[str, list[str]] = {}
        for row in self.rows:
            for column, cell in row.items():
                if column != "op" and cell not in (OK, NA):
                    where.setdefault(cell, []).append(f"{row['op']} {column}")
        for dtype, cell in self.dtypes.items():
            if cell not in (OK, NA):
                where.setdefault(cell, []).append(f"all_reduce {dtype}")
        return list(where.items())

    def to_dict(self) -> dict:
        return {"backend": self.backend, "device": self.device, "torch": self.torch, "world_size": self.world_size,
                "modes": self.modes, "reduce_ops": self.reduce_ops, "rows": self.rows,
                "all_reduce_dtypes": self.dtypes, "run_dir": str(self.run_dir)}


def probe_ops(session, timeout_s: float = 300) -> OpsReport:
    """Run the probe on every running node of the lab (one rank each) and read its table back."""
    nodes = [n.name for n in session.running()]
    if len(nodes) < 2:
        raise StateError(f"lab {session.name} has {len(nodes)} running node; the probe needs 2 or more",
                         hint=f"labctl up --lab {session.name} --nodes 2")
    plan = session.plan_run("-m", PROBE_MODULE, options=RunOptions(nproc_per_node=1, pg_timeout_s=None,
                                                                   timeout_s=timeout_s),
                            node_env=session.node_env(nodes))
    session.execute(plan, echo=False)
    return OpsReport.from_dict(json.loads((plan.run_dir / REPORT_FILE).read_text()), plan.run_dir)
