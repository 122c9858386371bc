"""`labctl bench straggler`: one slow node, before and after balancing the work.

The node's CPU limit is lowered in place (`docker update`, as `labctl slow` does), then runs
alternate: an even split of the global batch, and a split in proportion to each rank's speed
(`--rank-micro-batch`), measured from the first even run's per-rank compute time per sample. Same
samples per step, so the same gradient: only the waiting changes. The node's limit is put back at
the end, whatever happened. The median even and balanced runs' timelines (labctl trace) go side by
side, on one time scale, into straggler-timeline.png in the output folder.

With a pipeline (`--pipeline N`: gpt of N blocks for every run), each round also runs the trainer's
--strategy pp, a stage a node, on stages of equal blocks and on stages sized by each node's speed
(--stage-layers auto), the same global batch in 2 micro-batches a stage: the two answers to a slow
node side by side, data parallelism balanced and a pipeline sized. Their timelines go into
pipeline-timeline.png.
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
PIPELINES = ("pp-even", "pp-auto")  # --pipeline's runs: stages of equal blocks, stages sized by speed
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
    pipeline: dict | None = None  # --pipeline: {"layers", "micro_batches", "pp-even", "pp-auto" (FIGURES + stage_layers),
    #                               "speedup_auto_vs_even": pp-auto / even tokens/s, "timeline"}

    def as_dict(self) -> dict:
        """What --json prints."""
        return {"node": self.node, "cpus": self.cpus, "global_batch": self.global_batch,
                "rank_micro_batch": self.rank_micro_batch, "even": self.even, "balanced": self.balanced,
                "speedup": self.speedup, "timeline": self.timeline and str(self.timeline),
                **({"timeline_note": self.timeline_note} if self.timeline_note else {}),
                **({"pipeline": self.pipeline} if self.pipeline else {})}


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
    pipeline: int | None = None  # --pipeline: gpt of this many blocks, and the pp runs beside DDP's


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
    staged = pipeline_args(options, len(names), global_batch)
    base_args += ["--n-layer", str(options.pipeline)] if staged else []
    before = lab_docker.node_cpus_limit(session.client, session.name, node)
    lab_docker.apply_node_cpus(session.client, session.name, node, cpus)
    report(f"{node} limited to {cpus:g} CPUs")
    try:
        runs, override = run_rounds(lambda args: run_lab(session, every, base_args + args, node_env), repeats,
                                    global_batch, staged, report)
    finally:
        lab_docker.apply_node_cpus(session.client, session.name, node, before)
        report(f"{node} CPU limit restored to {f'{before:g} CPUs' if before else 'none'}")
    even, balanced = (split_figures(runs[split]) for split in SPLITS)
    folder = Path(out_dir or session.directory / "bench-straggler")
    timeline, note = draw_timelines(folder, runs, node, cpus)
    piped = pipeline_result(folder, runs, node, cpus, options.pipeline, even) if staged else None
    return StragglerResult(node, cpus, global_batch, override, even, balanced,
                           round(balanced["tokens_per_s"] / even["tokens_per_s"], 3), steps, repeats, timeline, note,
                           piped)


def run_rounds(train: Callable[[list[str]], dict], repeats: int, global_batch: int, staged: dict[str, list[str]],
               report: Callable[[str], None]) -> tuple[dict[str, list[dict]], str]:
    """`repeats` rounds, alternated: an even run, a balanced one (its split from the first even run),
    and `staged`'s pipeline runs. `train(extra flags)` runs the trainer and returns its SUMMARY.
    (every split's summaries, the balanced split as --rank-micro-batch takes it)."""
    runs: dict[str, list[dict]] = {split: [] for split in SPLITS + tuple(staged)}
    override = None
    for round_ in range(1, repeats + 1):
        even = train([])
        runs["even"].append(even)
        report(f"round {round_}, even split {even['micro_batches']}: {even['tokens_per_s']:,.0f} tokens/s, "
               f"slowest {even['slowest_node']}, others waited {even['waited_for_slowest_s']:.2f} s")
        override = override or balanced_override(even, global_batch)
        balanced = train(["--rank-micro-batch", override])
        runs["balanced"].append(balanced)
        report(f"round {round_}, balanced {balanced['micro_batches']}: {balanced['tokens_per_s']:,.0f} tokens/s, "
               f"others waited {balanced['waited_for_slowest_s']:.2f} s")
        for split, extra in staged.items():
            summary = train(extra)
            runs[split].append(summary)
            report(f"round {round_}, {split} stages {summary['stage_layers']}: {summary['tokens_per_s']:,.0f} tokens/s")
    return runs, override


def pipeline_args(options: StragglerOptions, nodes: int, global_batch: int) -> dict[str, list[str]]:
    """--pipeline's two runs' extra flags ({} without it): a stage a node, 2 micro-batches a stage
    (1 where the global batch does not split so); LabError (exit 2) where gpt's blocks cannot make a
    stage a node."""
    if options.pipeline is None:
        return {}
    if options.workload != "gpt" or options.pipeline < nodes:
        raise LabError(f"--pipeline {options.pipeline}: the pipeline runs cut gpt's blocks into a stage a node, and "
                       f"this lab has {nodes} nodes (--workload {options.workload})",
                       hint=f"--workload gpt --pipeline {max(nodes, options.pipeline)} or more")
    micro = 2 * nodes if global_batch % (2 * nodes) == 0 else nodes
    if global_batch % micro:
        raise LabError(f"--pipeline: the global batch {global_batch} does not split into {micro} equal micro-batches",
                       hint=f"a --micro-batch that is a multiple of {micro // nodes}")
    common = ["--strategy", "pp", "--schedule", "1f1b", "--micro-batches", str(micro)]
    return {"pp-even": common, "pp-auto": common + ["--stage-layers", "auto"]}


def pipeline_result(folder: Path, runs: dict[str, list[dict]], node: str, cpus: float, layers: int,
                    even: dict) -> dict:
    """--pipeline's part of the result: each pipeline's median run (and its stages), its speed-up
    over the even split, and their timelines side by side (pipeline-timeline.png)."""
    figures = {split: {**split_figures(runs[split]), "stage_layers": median_run(runs[split])["stage_layers"]}
               for split in PIPELINES}
    out = {"layers": layers, "micro_batches": median_run(runs["pp-even"])["pipeline_micro_batches"], **figures,
           "speedup_auto_vs_even": round(figures["pp-auto"]["tokens_per_s"] / even["tokens_per_s"], 3)}
    path, note = draw_timelines(folder, runs, node, cpus, PIPELINES, "pipeline-timeline.png")
    return {**out, "timeline": path and str(path), **({"timeline_note": note} if note else {})}


def draw_timelines(out_dir: Path, runs: dict[str, list[dict]], node: str, cpus: float, splits=SPLITS,
                   name: str = "straggler-timeline.png") -> tuple[Path | None, str]:
    """(`name` in `out_dir`: the median runs' timelines of `splits` side by side, the even and balanced
    ones by default, or None; why not). The numbers stand without the picture, so a run that left
    nothing to draw is said, not raised."""
    if not have_matplotlib():
        return None, f"no timeline picture: it is drawn with matplotlib; {INSTALL_HINT}"
    panels = [(f"{split}: " + (f"stages {pick['stage_layers']}" if pick.get("stage_layers")
                               else f"micro-batches {pick['micro_batches']}"), Path(pick["run_dir"]))
              for split, pick in ((split, median_run(runs[split])) for split in splits)]
    what = "before and after balancing" if splits == SPLITS else "a pipeline's stages, equal and sized by speed"
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        path = write_comparison(out_dir / name, panels, title=f"{node} at {cpus:g} CPUs: {what} (median runs)")
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
