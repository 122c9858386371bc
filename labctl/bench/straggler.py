"""`labctl bench straggler`: one slow node, before and after balancing the work.

The node's CPU limit is lowered in place (`docker update`, as `labctl slow` does), then runs
alternate: an even split of the global batch, and a split in proportion to each rank's speed
(`--rank-micro-batch`), measured from the first even run's per-rank compute time per sample. Same
samples per step, so the same gradient: only the waiting changes. The node's limit is put back at
the end, whatever happened. The median even and balanced runs' timelines (labctl trace) go side by
side, on one time scale, into straggler-timeline.png in the output folder.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from labctl.bench.scaling import Config, median_run
from labctl.bench.scaling_run import run_lab
from labctl.core.plotting import INSTALL_HINT, have_matplotlib
from labctl.engine import docker as lab_docker
from labctl.errors import LabError, RunFailed, StateError
from labctl.session import LabSession
from labctl.trace import write_comparison

SPLITS = ("even", "balanced")
# The median run's figures reported for each split.
FIGURES = ("micro_batches", "tokens_per_s", "step_ms", "compute_ms_per_step", "slowest_node", "slowest_compute_ratio",
           "waited_for_slowest_s", "final_loss")


@dataclass(frozen=True)
class StragglerResult:
    node: str
    cpus: float  # the node's CPU limit during the runs
    global_batch: int
    rank_micro_batch: str  # the balanced split, as --rank-micro-batch takes it: 0=21,1=21,2=6
    even: dict  # FIGURES of the median even run, and tokens_per_s_runs: every run's tokens/s
    balanced: dict
    speedup: float  # balanced / even tokens/s
    steps: int
    repeats: int
    timeline: Path | None = None  # the median runs' timelines side by side (a PNG); None: see timeline_note
    timeline_note: str = ""  # why there is no timeline picture

    def as_dict(self) -> dict:
        """What --json prints."""
        return {"node": self.node, "cpus": self.cpus, "global_batch": self.global_batch,
                "rank_micro_batch": self.rank_micro_batch, "even": self.even, "balanced": self.balanced,
                "speedup": self.speedup, "timeline": self.timeline and str(self.timeline),
                **({"timeline_note": self.timeline_note} if self.timeline_note else {})}


def _quiet(_message: str) -> None:
    pass


@dataclass(frozen=True)
class StragglerOptions:
    """What `labctl bench straggler` measures, as its options say it (see measure)."""

    node: str | None = None  # --node: the node to slow down; None: the lab's last
    cpus: float = 0.25  # --cpus: its CPU limit during the runs
    workload: str = "gpt"  # --workload: what the trainer trains
    micro_batch: int = 16  # --micro-batch: samples per rank per step with the even split
    steps: int = 30  # --steps: optimizer steps per run
    repeats: int = 2  # --repeats: alternated runs of each split; the median is reported


def measure(session: LabSession, options: StragglerOptions = StragglerOptions(), *, out_dir: Path | None = None,
            report: Callable[[str], None] = _quiet) -> StragglerResult:
    """Limit `options.node` (default the lab's last) to `options.cpus`, then `options.repeats` rounds
    of an even run and a balanced run of the same global batch (`options.micro_batch` x the nodes);
    the limit it had is restored. The timelines go to `out_dir` (default .lab/<lab>/bench-straggler/)."""
    cpus, micro_batch, steps, repeats = options.cpus, options.micro_batch, options.steps, options.repeats
    names = session.node_names()
    if len(names) < 2:
        raise StateError(f"lab {session.name} has {len(names)} node; a straggler needs others to wait for it",
                         hint=f"labctl up --lab {session.name} --nodes 3")
    node = session.require_node(options.node or names[-1], names)
    lab_docker.check_cpu_limits(session.client, {"--cpus": cpus})
    node_env = session.node_env(names)
    every = Config("all nodes", "lab", len(names), 1)
    global_batch = micro_batch * len(names)
    base_args = ["--workload", options.workload, "--steps", str(steps), "--global-batch", str(global_batch),
                 "--micro-batch", str(micro_batch), "--threads", "1"]
    runs: dict[str, list[dict]] = {split: [] for split in SPLITS}
    override = None
    before = lab_docker.node_cpus_limit(session.client, session.name, node)
    lab_docker.apply_node_cpus(session.client, session.name, node, cpus)
    report(f"{node} limited to {cpus:g} CPUs")
    try:
        for round_ in range(1, repeats + 1):
            even = run_lab(session, every, base_args, node_env)
            runs["even"].append(even)
            report(f"round {round_}, even split {even['micro_batches']}: {even['tokens_per_s']:,.0f} tokens/s, "
                   f"slowest {even['slowest_node']}, others waited {even['waited_for_slowest_s']:.2f} s")
            if override is None:
                override = balanced_override(even, global_batch)
            balanced = run_lab(session, every, base_args + ["--rank-micro-batch", override], node_env)
            runs["balanced"].append(balanced)
            report(f"round {round_}, balanced {balanced['micro_batches']}: {balanced['tokens_per_s']:,.0f} tokens/s, "
                   f"others waited {balanced['waited_for_slowest_s']:.2f} s")
    finally:
        lab_docker.apply_node_cpus(session.client, session.name, node, before)
        report(f"{node} CPU limit restored to {f'{before:g} CPUs' if before else 'none'}")
    even, balanced = (split_figures(runs[split]) for split in SPLITS)
    timeline, note = draw_timelines(Path(out_dir or session.directory / "bench-straggler"), runs, node, cpus)
    return StragglerResult(node, cpus, global_batch, override, even, balanced,
                           round(balanced["tokens_per_s"] / even["tokens_per_s"], 3), steps, repeats, timeline, note)


def draw_timelines(out_dir: Path, runs: dict[str, list[dict]], node: str, cpus: float) -> tuple[Path | None, str]:
    """(straggler-timeline.png in `out_dir`: the median even run's timeline beside the median balanced
    run's, or None; why not). The numbers stand without the picture, so a run that left nothing to
    draw is said, not raised."""
    if not have_matplotlib():
        return None, f"no timeline picture: it is drawn with matplotlib; {INSTALL_HINT}"
    panels = [(f"{split}: micro-batches {pick['micro_batches']}", Path(pick["run_dir"]))
              for split, pick in ((split, median_run(runs[split])) for split in SPLITS)]
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        path = write_comparison(out_dir / "straggler-timeline.png", panels,
                                title=f"{node} at {cpus:g} CPUs: before and after balancing (median runs)")
    except LabError as exc:
        return None, f"no timeline picture: {exc.message}"
    return path, ""


def balanced_override(even: dict, global_batch: int) -> str:
    """--rank-micro-batch for an even run's SUMMARY: the global batch split by each rank's speed."""
    per_sample = compute_ms_per_sample(Path(even["run_dir"]), even["micro_batches"], even["accum_steps"])
    sizes = balanced_micro_batches(global_batch, per_sample)
    return ",".join(f"{rank}={size}" for rank, size in enumerate(sizes))


def split_figures(summaries: list[dict]) -> dict:
    """The median run's FIGURES, and every run's tokens/s."""
    pick = median_run(summaries)
    return {**{k: pick[k] for k in FIGURES}, "tokens_per_s_runs": [s["tokens_per_s"] for s in summaries]}


def balanced_micro_batches(total: int, ms_per_sample: list[float]) -> list[int]:
    """Split `total` samples over the ranks in proportion to their speed (largest remainder).

    Every rank keeps at least one sample: DDP needs each rank's gradient at every step.
    """
    n = len(ms_per_sample)
    if total < n:
        raise ValueError(f"{total} samples cannot give each of {n} ranks one")
    speeds = [1 / max(ms, 1e-9) for ms in ms_per_sample]
    spare = total - n  # one each first, the rest by speed
    quotas = [spare * s / sum(speeds) for s in speeds]
    sizes = [1 + int(q) for q in quotas]
    by_remainder = sorted(range(n), key=lambda r: quotas[r] - int(quotas[r]), reverse=True)
    for r in by_remainder[: total - sum(sizes)]:
        sizes[r] += 1
    return sizes


def compute_ms_per_sample(run_dir: Path, micro_batches: list[int], accum_steps: int) -> list[float]:
    """Each rank's mean compute time per sample over the steady steps, from its metrics file."""
    out = []
    for rank, micro in enumerate(micro_batches):
        path = Path(run_dir) / f"metrics-rank{rank}.jsonl"
        try:
            records = [json.loads(line) for line in path.read_text().splitlines()]
        except OSError as exc:
            raise RunFailed(f"cannot read rank {rank}'s metrics at {path}: {exc.strerror or exc}") from None
        steps = [r["compute_ms"] for r in records if r.get("kind") == "step"][1:]
        out.append(statistics.fmean(steps) / (micro * accum_steps))
    return out
