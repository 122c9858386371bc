"""`labctl bench scaling`: what scaling out buys, as the table people ask for.

Every row trains the same workload for the same number of steps with the same micro-batch per
process (weak scaling: the global batch grows with the world size), one CPU thread per process,
and reads the trainer's SUMMARY (trainer/instrument.py defines its figures):

  host, 1 proc          the baseline every efficiency is measured against
  host, 1 GPU           the same process on the host's GPU (nccl, world size 1), where the host
                        has one: the same workload and global batch; its "efficiency" is its
                        speed-up over the 1-process CPU baseline
  host, torchrun xN     N processes on the host (`torchrun --standalone`): the same processes
                        without containers or a network between them
  node0 x P             P processes in one node (torchrun --nproc-per-node P)
  N nodes               N nodes x 1 process, unshaped
  N nodes @ RATE        the same, every node's link shaped to RATE (tc tbf)
  N nodes @ RATE + T    with --delay T, every shaped link also delays by T one way (netem)
  N GPU nodes (@ RATE)  N nodes with a GPU each (`labctl up --gpus`), nccl over the lab's network,
                        unshaped and shaped, where the lab's first N nodes have GPUs

Beside each measurement sits the ring cost model's all-reduce time for the model's fp32
gradients at the shaped rate (labctl/bench/cost.py). Rows are run in rounds, so with --repeats each
configuration is measured several times interleaved with the others and the median is reported:
a change in the machine's load hits every row alike.

This module plans the rows and turns SUMMARY lines into the table, its Markdown and its plots;
scaling_run.py runs them on the host and the lab.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

from labctl.bench.cost import DEFAULT_ALPHA_S, Link, collective_time_s
from labctl.core.plotting import pyplot
from labctl.errors import RunFailed


@dataclass
class Config:
    """One row's configuration."""

    name: str
    place: str  # "host" or "lab"
    nodes: int
    nproc_per_node: int
    bw: str | None = None  # the shaped link as given, e.g. "1gbit" or "1gbit + 10ms"; None = unshaped
    rate_bps: int | None = None
    device: str = "cpu"  # "cuda": the host's GPU row
    delay_s: float = 0.0  # the shaped link's one-way netem delay

    @property
    def world_size(self) -> int:
        return self.nodes * self.nproc_per_node


@dataclass
class ScalingRow:
    name: str
    place: str
    nodes: int
    nproc_per_node: int
    bw: str  # "unshaped", "loopback" (host, one node), or the rate
    world_size: int
    tokens_per_s: float
    step_ms: float
    compute_ms_per_step: float
    allreduce_ms_per_step: float
    model_ms_per_step: float | None
    comm_fraction: float
    comm_over_compute: float | None
    efficiency: float | None  # tokens/s / (world size x the 1-process baseline)
    samples: list[float] = field(default_factory=list)  # tokens/s of every repeat
    device: str = "cpu"

    def as_dict(self) -> dict:
        return asdict(self)


GPU_ROW = "host, 1 GPU"
NO_GPU_NOTE = "no GPU on this machine: the 1-GPU row is not measured"


def no_gpu_nodes_note(lab: str, gpu_nodes: int) -> str:
    return (f"lab {lab} has {gpu_nodes} GPU node(s): the GPU-node rows are not measured "
            f"(they need 2 or more: `labctl up --lab {lab} --nodes 2 --gpus 2` on a machine with 2 GPUs)")


def plan(nodes_list: list[int], rates: list[tuple[str, int]], nproc: int, host: bool = True,
         gpu: bool = False, gpu_nodes: int = 0, delay: tuple[str, float] | None = None) -> list[Config]:
    """Every row, in the order of the table; `gpu` (the host has one) adds the host's 1-GPU row,
    `gpu_nodes` (how many of the lab's first nodes have a GPU) the GPU-node rows for the counts of
    `nodes_list` from 2 up to it; `delay` (as given, seconds) delays every shaped row's links."""
    rows = []
    if host:
        rows.append(Config("host, 1 proc", "host", 1, 1))
        if gpu:
            rows.append(Config(GPU_ROW, "host", 1, 1, device="cuda"))
        rows += [Config(f"host, torchrun x{n}", "host", 1, n) for n in nodes_list if n > 1]
    if nproc > 1:
        rows.append(Config(f"node0 x {nproc} procs", "lab", 1, nproc))
    rows += [Config(f"{n} node{'s' if n > 1 else ''}", "lab", n, 1) for n in nodes_list]
    on_gpus = [n for n in nodes_list if 2 <= n <= gpu_nodes]
    rows += [Config(f"{n} GPU nodes", "lab", n, 1, device="cuda") for n in on_gpus]
    delay_text, delay_s = delay or ("", 0.0)
    for bw, rate in rates:
        link = f"{bw} + {delay_text}" if delay_text else bw
        rows += [Config(f"{n} nodes @ {link}", "lab", n, 1, link, rate, delay_s=delay_s) for n in nodes_list if n > 1]
        rows += [Config(f"{n} GPU nodes @ {link}", "lab", n, 1, link, rate, device="cuda", delay_s=delay_s)
                 for n in on_gpus]
    return rows


def model_ms(params: int, world_size: int, rate_bps: int | None, efficiency: float, delay_s: float = 0.0) -> float | None:
    """The ring all-reduce of fp32 gradients at the shaped rate, 50 us plus the delay a hop; None
    when no link rate applies."""
    if world_size < 2:
        return 0.0
    if not rate_bps:
        return None
    link = Link(rate_bps, DEFAULT_ALPHA_S, delay_s, name="shaped")
    return collective_time_s(params * 4, world_size, link, efficiency) * 1e3


def median_run(summaries: list[dict]) -> dict:
    """The run with the median tokens/s (the upper one of an even count), with all its figures."""
    return sorted(summaries, key=lambda s: s["tokens_per_s"])[len(summaries) // 2]


def check_same_corpus(summaries: dict[str, list[dict]]) -> None:
    """Rows are comparable only if every run trained on the same text: refuse a table that mixes corpora
    (a host or node running another trainer/corpus.py)."""
    seen: dict[str, list[str]] = {}
    for name, runs in summaries.items():
        for digest in {s["corpus_sha256"] for s in runs if "corpus_sha256" in s}:
            seen.setdefault(digest, []).append(name)
    if len(seen) > 1:
        groups = "; ".join(f"{', '.join(names)}: sha256 {digest[:12]}" for digest, names in seen.items())
        raise RunFailed(f"the rows trained on different corpora ({groups}), so their tokens/s and losses do not "
                        "compare; run the same trainer/corpus.py on the host and in the nodes")


def build_rows(configs: list[Config], summaries: dict[str, list[dict]], efficiency: float) -> list[ScalingRow]:
    """Rows from every configuration's SUMMARY lines (one per repeat); medians over repeats."""
    check_same_corpus(summaries)
    baseline = None
    rows = []
    for config in configs:
        runs = summaries[config.name]
        pick = median_run(runs)
        tokens = [s["tokens_per_s"] for s in runs]
        if config.world_size == 1 and config.device == "cpu" and baseline is None:
            baseline = statistics.median(tokens)
        compute = pick["compute_ms_per_step"]
        allreduce = pick["allreduce_ms_per_step"]
        rows.append(ScalingRow(
            name=config.name, place=config.place, nodes=config.nodes, nproc_per_node=config.nproc_per_node,
            bw=config.bw or ("loopback" if config.nodes == 1 else "unshaped"), world_size=config.world_size,
            tokens_per_s=statistics.median(tokens), step_ms=pick["step_ms"], compute_ms_per_step=compute,
            allreduce_ms_per_step=allreduce,
            model_ms_per_step=model_ms(pick.get("params", 0), config.world_size, config.rate_bps, efficiency,
                                       config.delay_s),
            comm_fraction=pick["comm_fraction"],
            comm_over_compute=round(allreduce / compute, 3) if compute else None,
            efficiency=round(statistics.median(tokens) / (config.world_size * baseline), 3) if baseline else None,
            samples=tokens, device=config.device,
        ))
    return rows


def ratio_rows(rows: list[ScalingRow]) -> list[tuple[int, float, float, float]]:
    """(N, tokens/s of N nodes unshaped, of N host processes, their ratio) for every N in both."""
    cpu = [r for r in rows if r.device == "cpu"]
    lab = {r.world_size: r.tokens_per_s for r in cpu if r.place == "lab" and r.nproc_per_node == 1 and r.bw == "unshaped"}
    host = {r.world_size: r.tokens_per_s for r in cpu if r.place == "host" and r.world_size > 1}
    return [(n, lab[n], host[n], lab[n] / host[n]) for n in sorted(lab) if n in host and host[n]]


# ------------------------------------------------------------------------------ output


def markdown(rows: list[ScalingRow], title: str, notes: list[str] = ()) -> str:
    def num(value, fmt):
        return "-" if value is None else format(value, fmt)

    lines = [f"**{title}**", "",
             "| run | nodes x procs | link | tokens/s | efficiency | step ms | compute ms | allreduce ms (measured) "
             "| allreduce ms (model) | T_comm / T_compute | comm fraction |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r.name} | {r.nodes} x {r.nproc_per_node} | {r.bw} | {r.tokens_per_s:,.0f} | "
                     f"{num(r.efficiency, '.2f')} | {r.step_ms:.1f} | {r.compute_ms_per_step:.1f} | "
                     f"{r.allreduce_ms_per_step:.1f} | {num(r.model_ms_per_step, '.1f')} | "
                     f"{num(r.comm_over_compute, '.2f')} | {r.comm_fraction:.0%} |")
    ratios = ratio_rows(rows)
    if ratios:
        lines += ["", "| N | N nodes x 1 proc (tokens/s) | host torchrun --standalone xN (tokens/s) | ratio |",
                  "| ---: | ---: | ---: | ---: |"]
        lines += [f"| {n} | {lab:,.0f} | {host:,.0f} | {ratio:.2f} |" for n, lab, host, ratio in ratios]
    lines += ["", *notes] if notes else []
    return "\n".join(lines) + "\n"


def plot(rows: list[ScalingRow], out: Path, title: str) -> list[Path]:
    """scaling.png (tokens/s against nodes per link) and breakdown.png (compute vs communication)."""
    plt = pyplot()
    paths = [out / "scaling.png", out / "breakdown.png"]
    for draw, path, width in ((plot_scaling, paths[0], 7), (plot_breakdown, paths[1], 8)):
        fig, ax = plt.subplots(figsize=(width, 4.2), dpi=120)
        draw(ax, rows)
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
    return paths


def plot_scaling(ax, rows: list[ScalingRow]) -> None:
    """Tokens/s against processes: a line per link rate, the host's processes, the GPU, and linear."""
    from matplotlib.ticker import MaxNLocator

    series: dict[str, list[ScalingRow]] = {}
    for r in rows:
        if r.place == "lab" and r.nproc_per_node == 1:
            series.setdefault("unshaped" if r.bw in ("unshaped", "loopback") else r.bw, []).append(r)
        elif r.place == "host":
            label = "host, 1 GPU (nccl)" if r.device == "cuda" else "host processes (torchrun --standalone)"
            series.setdefault(label, []).append(r)
    for label, points in series.items():
        points.sort(key=lambda r: r.world_size)
        style = "D" if "GPU" in label else "s--" if label.startswith("host") else "o-"
        ax.plot([r.world_size for r in points], [r.tokens_per_s for r in points], style, label=label)
    base = next((r.tokens_per_s for r in rows if r.world_size == 1 and r.device == "cpu"), None)
    if base:
        top = max(r.world_size for r in rows)
        ax.plot([1, top], [base, base * top], ":", color="grey", label="linear from 1 process")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("processes (nodes x 1, or host processes)")
    ax.set_ylabel("tokens / s")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)


def plot_breakdown(ax, rows: list[ScalingRow]) -> None:
    """Each row's step: compute, the rest, and where the cost model puts compute plus the all-reduce."""
    names = [r.name for r in rows]
    compute = [r.compute_ms_per_step for r in rows]
    comm = [max(r.step_ms - r.compute_ms_per_step, 0) for r in rows]
    ax.barh(names, compute, label="compute (forward + backward), slowest rank")
    ax.barh(names, comm, left=compute, label="rest of the step: communication, waiting, optimizer")
    models = [(i, r.model_ms_per_step) for i, r in enumerate(rows) if r.model_ms_per_step]
    if models:
        ax.scatter([compute[i] + m for i, m in models], [i for i, _ in models], marker="|", s=200, color="black",
                   label="compute + cost-model all-reduce", zorder=3)
    ax.invert_yaxis()
    ax.set_xlabel("ms per step")
    ax.grid(True, axis="x", alpha=0.3)


def write_outputs(rows: list[ScalingRow], out: Path, title: str, meta: dict, plots: bool = True) -> list[Path]:
    """scaling.md and scaling.json, and with `plots` (matplotlib installed) the two PNGs; meta's
    "notes" (e.g. NO_GPU_NOTE) go under the table too."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "scaling.md").write_text(markdown(rows, title, meta.get("notes", [])))
    (out / "scaling.json").write_text(json.dumps({**meta, "rows": [r.as_dict() for r in rows]}, indent=1) + "\n")
    return [out / "scaling.md", out / "scaling.json", *(plot(rows, out, title) if plots else [])]
