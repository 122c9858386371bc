"""`labctl bench predict`: the trainer's step model against the steps it predicts, over a grid.

Every trainer run predicts its own step before step 1 (trainer/stepmodel.py, calibrated by
trainer/calibrate.py) and measures it. This bench runs the trainer over a grid of configurations
on the running lab (grid(): node counts, links, bucket sizes, accumulation, ranks per node, a
straggler, the strategies), each on the lab's first N nodes, and reports predicted against
measured for each row, with the median and the 90th percentile of the absolute error: the table
(predict.md), the rows (predict.json) and a picture (predict.png) in the output folder.

Runs are grouped by link rate, so the links are shaped once per rate and cleared at the end, and a
straggler's node gets its CPU limit only for its own runs (put back whatever happens).
"""

from __future__ import annotations

import json
import math
import statistics
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from labctl.bench.scaling import Config
from labctl.bench.scaling_run import lab_for, run_lab
from labctl.core.outfile import save_figure
from labctl.core.plotting import have_matplotlib, pyplot
from labctl.engine import docker as lab_docker
from labctl.errors import StateError
from labctl.net import apply as netshape
from labctl.net.tc import Shape
from labctl.session import LabSession
from labctl.spec.units import parse_rate

LARGER = ("--n-embd", "128", "--n-layer", "4")  # 3.2 MB of gradients: buckets of 1 MiB make several
PIPELINE = ("--strategy", "pp", "--n-layer", "6", "--micro-batches", "6")  # a stage a node, 6 micro-batches
# each block split over a node's 2 processes, replicated (tp) or sharded (fsdp+tp) across nodes
TENSOR = (("--strategy", "tp"), ("--strategy", "fsdp+tp"))


@dataclass(frozen=True)
class Case:
    """One configuration of the grid: where it runs, over which link, with which trainer flags."""

    nodes: int
    bw: str | None = None  # the links' rate, as `labctl shape --bw` takes it; None: unshaped
    args: tuple[str, ...] = ()  # the trainer's flags beyond the workload's
    nproc_per_node: int = 1
    slow_cpus: float | None = None  # the last of its nodes limited to this many CPUs: a straggler
    spine: str | None = None  # its nodes in two halves joined by this rate both ways (`shape --to`)
    workload: str = "gpt"  # the trainer's --workload; the gpt runs --steps, others their own args

    @property
    def name(self) -> str:
        if self.workload != "gpt":  # make demo's own run
            return f"{self.nodes} nodes, {self.bw or 'unshaped'}, {self.workload} {' '.join(self.args)} (make demo's run)"
        parts = [f"{self.nodes} nodes", self.bw or "unshaped", *([f"{self.nproc_per_node}/node"] if self.nproc_per_node > 1 else []),
                 *([f"straggler {self.slow_cpus:g} CPU"] if self.slow_cpus else []),
                 *([f"2 groups joined by {self.spine}"] if self.spine else []), " ".join(self.args)]
        return ", ".join(p for p in parts if p)


def grid(max_nodes: int) -> list[Case]:
    """The default grid, each case on no more nodes than the lab has (39 on 8 nodes, 33 on 4, 19 on 3, 15 on 2):
    first make demo's own run (the toy workload, 3 nodes, unshaped), the first prediction a newcomer
    sees; then the gpt's."""
    cases = [Case(3, None, ("--epochs", "3"), workload="toy")]
    cases += [Case(n, bw) for n in (2, 4, 8) for bw in (None, "1gbit", "100mbit")]
    cases += [Case(n, bw, ("--global-batch", str(4 * 8 * n))) for n in (2, 8) for bw in ("1gbit", "100mbit")]
    cases += [Case(n, bw, (*LARGER, "--bucket-cap-mb", cap)) for n in (2, 4) for bw in ("1gbit", "100mbit")
              for cap in ("1", "25")]
    cases += [Case(n, bw, nproc_per_node=2) for n in (2, 4) for bw in ("1gbit", "100mbit")]
    cases += [Case(n, "1gbit", slow_cpus=0.5) for n in (2, 4)]
    cases += [Case(4, "1gbit", ("--strategy", strategy)) for strategy in ("zero", "fsdp")]
    cases += [Case(n, "1gbit", args, spine="100mbit") for n, args in ((4, ()), (4, LARGER), (8, ()))]
    cases += [Case(3, bw, PIPELINE) for bw in (None, "100mbit")]
    cases += [Case(3, "1gbit", (*PIPELINE, "--stage-layers", "auto"), slow_cpus=0.25)]
    cases += [Case(2, bw, TENSOR[0], nproc_per_node=2) for bw in (None, "100mbit")]
    cases += [Case(2, "1gbit", TENSOR[1], nproc_per_node=2)]
    return [c for c in cases if c.nodes <= max_nodes]


@dataclass(frozen=True)
class PredictRow:
    case: str
    nodes: int
    world_size: int
    bw: str | None
    predicted_step_ms: float
    measured_step_ms: float
    error: float  # measured over predicted, less 1
    predicted_exposed_comm_ms: float
    exposed_comm_ms: float | None
    step_model: dict  # the prediction's terms and calibration, as the SUMMARY has them (the median run's)
    run_errors: list[float]  # each run's own step_model_error
    trusted: bool = True  # most of its runs predicted their step; False: most said it was too short to predict
    run_trusted: list[bool] | None = None  # each run's step_model_trusted

    def as_dict(self) -> dict:
        return asdict(self)


def row_of(case: Case, summaries: list[dict]) -> PredictRow:
    """A case's row from its runs: the median prediction against the median measurement (one run: its own)."""
    def median(key):
        values = [s[key] for s in summaries if s.get(key) is not None]
        return statistics.median(values) if values else None

    predicted, measured = median("predicted_step_ms"), median("step_ms")
    trusted = [s.get("step_model_trusted", True) for s in summaries]
    middle = min(summaries, key=lambda s: abs(s["step_ms"] - measured))  # the run whose terms are shown
    return PredictRow(case.name, case.nodes, summaries[0]["world_size"], case.bw, round(predicted, 3), round(measured, 3),
                      round(measured / predicted - 1, 4), median("predicted_exposed_comm_ms"), median("exposed_comm_ms"),
                      middle.get("step_model", {}), [s["step_model_error"] for s in summaries],
                      2 * sum(trusted) > len(trusted), trusted)


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100), by linear interpolation between the closest ranks."""
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def error_stats(rows: list[PredictRow]) -> dict:
    """The median and 90th percentile of the absolute errors of the cases predicted, and the largest;
    a case most of whose runs said their step was too short to predict is counted apart
    ("too_short"), and "all_cases" gives the same three over every case, as if each were predicted."""
    def three(errors: list[float]) -> dict:
        errors = errors or [float("nan")]
        return {"median_abs_error": round(statistics.median(errors), 4), "p90_abs_error": round(percentile(errors, 90), 4),
                "max_abs_error": round(max(errors), 4)}

    predicted = [abs(r.error) for r in rows if r.trusted]
    return {"rows": len(predicted), "too_short": sum(not r.trusted for r in rows), **three(predicted),
            "all_cases": {"rows": len(rows), **three([abs(r.error) for r in rows])}}


def stats_line(stats: dict) -> str:
    """The error's statistics in words, under the table (predict.md, and what the command prints)."""
    line = (f"{stats['rows']} cases predicted: median absolute error {stats['median_abs_error']:.1%}, 90th "
            f"percentile {stats['p90_abs_error']:.1%}, largest {stats['max_abs_error']:.1%}")
    if not stats.get("too_short"):
        return line
    every = stats["all_cases"]
    return (f"{line}; {stats['too_short']} too short to predict (every {every['rows']} cases counted: "
            f"{every['median_abs_error']:.1%}, {every['p90_abs_error']:.1%}, {every['max_abs_error']:.1%})")


def error_text(row: PredictRow) -> str:
    """A row's error, with its runs' spread where there were several; "too short" where not predicted."""
    if not row.trusted:
        return f"too short ({row.error:+.0%})"
    shorts = sum(not t for t in row.run_trusted or [])
    short = f", {shorts} of {len(row.run_errors)} too short" if shorts else ""
    runs = f" ({min(row.run_errors):+.1%} to {max(row.run_errors):+.1%}{short})" if len(row.run_errors) > 1 else ""
    return f"{row.error:+.1%}{runs}"


def markdown(rows: list[PredictRow], stats: dict, title: str) -> str:
    lines = [f"# {title}", "", "| case | world | predicted (ms) | measured (ms) | error |", "| --- | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r.case} | {r.world_size} | {r.predicted_step_ms:.1f} | {r.measured_step_ms:.1f} | {error_text(r)} |"
              for r in rows]
    lines += ["", stats_line(stats), ""]
    return "\n".join(lines)


def plot(rows: list[PredictRow], path: Path, title: str) -> Path:
    """Predicted against measured, one point per case predicted (not those too short to predict), on
    log axes with the line of equality and +-10%."""
    rows = [r for r in rows if r.trusted]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 6))
    for bw in sorted({r.bw or "unshaped" for r in rows}):
        mine = [r for r in rows if (r.bw or "unshaped") == bw]
        ax.scatter([r.predicted_step_ms for r in mine], [r.measured_step_ms for r in mine], label=bw)
    lo = min(min(r.predicted_step_ms, r.measured_step_ms) for r in rows) * 0.8
    hi = max(max(r.predicted_step_ms, r.measured_step_ms) for r in rows) * 1.25
    ax.plot([lo, hi], [lo, hi], "k-", linewidth=0.8, label="measured = predicted")
    for factor in (0.9, 1.1):
        ax.plot([lo, hi], [lo * factor, hi * factor], "k:", linewidth=0.6)
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="predicted step (ms)",
           ylabel="measured step (ms)")
    ticks = [t * 10**k for k in range(-1, 6) for t in (1, 2, 5) if lo <= t * 10**k <= hi]
    for axis in (ax.xaxis, ax.yaxis):  # plain numbers of ms at 1, 2, 5 x 10^k, not powers of ten
        axis.set_ticks(ticks)
        axis.set_major_formatter(ScalarFormatter())
        axis.set_minor_formatter(NullFormatter())
    head, _, rest = title.partition(", ")  # the title's first clause on top, the rest under it
    ax.set_title(f"{head}\n{rest}", fontsize=9)
    ax.legend(title="link (dotted: +-10%)")
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return path


@dataclass(frozen=True)
class PredictReport:
    """`labctl bench predict`'s answer: a row per run, the error's statistics, the files written."""

    rows: list[PredictRow]
    stats: dict
    title: str
    paths: list[Path]


def _quiet(_message: str) -> None:
    pass


def measure(session: LabSession, steps: int = 20, repeats: int = 1, *, out_dir: Path | None = None,
            report: Callable[[str], None] = _quiet) -> PredictReport:
    """Every case of the grid the running lab has nodes for (it must be up, links unshaped), `repeats`
    runs of each (the median's row), written to `out_dir` (default .lab/<lab>/bench-predict)."""
    names, _counts, _gpus = lab_for(session, None)
    cases = grid(len(names))
    if len(cases) < 2:
        raise StateError(f"lab {session.name} has {len(names)} node; the grid's cases need 2 or more",
                         hint=f"labctl up --lab {session.name} --nodes 8 (all {len(grid(8))} cases; 2 nodes run "
                              f"{len(grid(2))} of them)")
    node_env = session.node_env(names)
    runs: dict[Case, list[dict]] = {c: [] for c in cases}
    iface = session.config.iface
    try:
        for bw in dict.fromkeys(c.bw for c in cases):  # the unshaped cases first, then each rate once
            if bw:
                netshape.apply_shape(session.client, session.name, names, Shape(parse_rate(bw, "--bw")), iface)
            for _ in range(repeats):  # rounds: a case's runs apart in time, so drift hits every case alike
                for case in (c for c in cases if c.bw == bw):
                    summary = run_case(session, case, names, node_env, steps)
                    runs[case].append(summary)
                    report(f"[{sum(map(len, runs.values()))}/{len(cases) * repeats}] {case.name}: predicted "
                           f"{summary['predicted_step_ms']:.1f} ms, measured {summary['step_ms']:.1f} ms "
                           f"({summary['step_model_error']:+.1%})")
    finally:
        netshape.clear_shape(session.client, session.name, names, iface)
    rows = [row_of(case, summaries) for case, summaries in runs.items()]
    return write_report(rows, f"Step model: predicted against measured, make demo's run and the gpt at {steps} steps a run, "
                              f"{'the median of ' + str(repeats) + ' runs' if repeats > 1 else 'one run'} a case, "
                              f"{session.cpus} CPUs", out_dir or session.directory / "bench-predict", report)


def write_report(rows: list[PredictRow], title: str, out: Path, report: Callable[[str], None]) -> PredictReport:
    """predict.md, predict.json and (matplotlib installed) predict.png in `out`."""
    stats = error_stats(rows)
    out.mkdir(parents=True, exist_ok=True)
    (out / "predict.md").write_text(markdown(rows, stats, title))
    (out / "predict.json").write_text(json.dumps({**stats, "title": title, "rows": [r.as_dict() for r in rows]},
                                                 indent=1) + "\n")
    drawn = have_matplotlib() and any(r.trusted for r in rows)  # a picture of the cases predicted, if any
    paths = [out / "predict.md", out / "predict.json"] + ([plot(rows, out / "predict.png", title)] if drawn else [])
    report("wrote " + ", ".join(str(p) for p in paths))
    return PredictReport(rows, stats, title, paths)


def run_case(session: LabSession, case: Case, names: list[str], node_env: dict, steps: int) -> dict:
    """One run of `case` on the lab's first case.nodes nodes: its SUMMARY. A straggler case limits its
    last node's CPUs for the run only."""
    config = Config(case.name, "lab", case.nodes, case.nproc_per_node, case.bw)
    args = ["--workload", case.workload, *(["--steps", str(steps)] if case.workload == "gpt" else []), *case.args]
    if case.spine:
        with spine(session, names[:case.nodes], Shape(parse_rate(case.spine, "--to"))):
            return run_lab(session, config, args, node_env)
    if not case.slow_cpus:
        return run_lab(session, config, args, node_env)
    node = names[case.nodes - 1]
    before = lab_docker.node_cpus_limit(session.client, session.name, node)
    lab_docker.apply_node_cpus(session.client, session.name, node, case.slow_cpus)
    try:
        return run_lab(session, config, args, node_env)
    finally:
        lab_docker.apply_node_cpus(session.client, session.name, node, before)


@contextmanager
def spine(session: LabSession, nodes: list[str], shape: Shape):
    """`nodes` in two halves, what each sends to the other through `shape` (`labctl shape --to`, both
    ways), for the block only."""
    first, second = nodes[:len(nodes) // 2], nodes[len(nodes) // 2:]
    client, lab, iface = session.client, session.name, session.config.iface
    try:
        for senders, receivers in ((first, second), (second, first)):
            netshape.apply_routes(client, lab, senders, receivers, shape, iface)
        yield
    finally:
        for senders, receivers in ((first, second), (second, first)):
            netshape.apply_routes(client, lab, senders, receivers, None, iface)
