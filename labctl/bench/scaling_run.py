"""Running `labctl bench scaling`: every row of scaling.plan on the host or the lab, the shaped rows
between shaping every link and clearing it again, and the table written out.

`measure` is the whole benchmark on a running lab (a LabSession); `run_host` and `run_lab` run the
trainer once and return its SUMMARY (`bench straggler` runs the lab's the same way).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from labctl.bench.cost import DEFAULT_EFFICIENCY
from labctl.bench.scaling import (
    NO_GPU_NOTE,
    Config,
    ScalingRow,
    build_rows,
    no_gpu_nodes_note,
    plan,
    write_outputs,
)
from labctl.core import assets
from labctl.core.plotting import INSTALL_HINT, have_matplotlib
from labctl.core.proc import run
from labctl.errors import CommandError, ConfigError, LabError, RunFailed, StateError
from labctl.net import apply as netshape
from labctl.net.tc import Shape
from labctl.run.plan import RunOptions
from labctl.run.result import find_summary
from labctl.session import LabSession
from labctl.spec.labspec import parse_nodes_list
from labctl.spec.units import parse_rate, parse_time_us

LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
               "LOCAL_WORLD_SIZE", "GROUP_RANK")
HOST_TIMEOUT_S = 600
DEFAULT_RATES = ("1gbit", "100mbit")


@dataclass(frozen=True)
class ScalingReport:
    """`labctl bench scaling`'s answer: the rows, the table's title, and the files written."""

    rows: list[ScalingRow]
    title: str
    paths: list[Path]  # scaling.md, scaling.json and the plots
    notes: list[str] = ()  # what was not measured and why, e.g. NO_GPU_NOTE


def _quiet(_message: str) -> None:
    pass


def shaped_rates(rates: Sequence[str]) -> list[tuple[str, int]]:
    """(rate as given, bits/s) of each shaped row's link: `rates`, or 1gbit and 100mbit when none are
    given; none at all for ['none']."""
    if list(rates) == ["none"]:
        return []
    return [(r, parse_rate(r, "--bw")) for r in (rates or DEFAULT_RATES)]


def shaped_delay(delay: str | None, shaped: list[tuple[str, int]]) -> tuple[str, float] | None:
    """(delay as given, seconds) for the shaped rows' links, or None; refused with no shaped rows."""
    if delay is None:
        return None
    delay_us = parse_time_us(delay, "--delay")
    if not shaped:
        raise ConfigError("--delay", delay, "delays the shaped rows' links, and --bw none leaves no shaped row",
                          hint="labctl bench scaling --bw 1gbit --delay 10ms")
    return str(delay).strip(), delay_us / 1e6


@dataclass(frozen=True)
class ScalingOptions:
    """What `labctl bench scaling` measures, as its options say it (see measure)."""

    workload: str = "gpt"  # --workload: what the trainer trains
    nodes_list: str | Sequence[int] | None = None  # --nodes-list: the node counts; None: 1 up to the lab's size
    rates: Sequence[str] = ()  # --bw: the shaped rows' link rates (see shaped_rates)
    delay: str | None = None  # --delay: a one-way delay on every shaped row's links, e.g. "10ms" (netem)
    nproc: int | None = None  # --nproc: processes of the one-node row; None: the largest node count; 1: no such row
    steps: int = 40  # --steps: optimizer steps per row
    micro_batch: int = 8  # --micro-batch: samples per process per step
    threads: int = 1  # --threads: CPU threads per process
    repeats: int = 1  # --repeats: rounds over all rows; each row reports its median
    efficiency: float = DEFAULT_EFFICIENCY  # --efficiency: what the cost model assumes
    host: bool = True  # the rows run on this machine too (--no-host: False)


def measure(session: LabSession, options: ScalingOptions = ScalingOptions(), *, out_dir: Path | None = None,
            report: Callable[[str], None] = _quiet) -> ScalingReport:
    """Every row, `options.repeats` rounds of them (each row's median reported), written to `out_dir`
    (default .lab/<lab>/bench-scaling). The lab must be up with the largest node count in
    `options.nodes_list` (default: 1 up to its size), and unshaped: the shaped rows shape and clear
    here. A delay (`options.delay`) needs the kernel's netem: probed before anything runs."""
    shaped = shaped_rates(options.rates)
    delayed = shaped_delay(options.delay, shaped)
    names, counts, gpu_nodes = lab_for(session, options.nodes_list)
    if delayed:  # refused now, not after the unshaped rows' minutes
        netshape.check_netem(session.client, session.name, names[0])
    plots = plots_possible(report)
    host_python = session.config.host_python or sys.executable
    gpu, notes = host_side(session, host_python, options.host, gpu_nodes, report)
    configs = plan(counts, shaped, options.nproc or max(counts), host=options.host, gpu=bool(gpu), gpu_nodes=gpu_nodes,
                   delay=delayed)
    trainer_args = ["--workload", options.workload, "--steps", str(options.steps),
                    "--micro-batch", str(options.micro_batch), "--threads", str(options.threads)]
    node_env = session.node_env(names)
    out = out_dir or session.directory / "bench-scaling"
    summaries: dict[str, list[dict]] = {c.name: [] for c in configs}

    def run(c: Config) -> None:
        if c.place == "host":
            runs = out / "host-runs" / c.name.replace(", ", "-").replace(" ", "")
            summary = run_host(c, trainer_args, runs, options.threads, host_python, session.config.node_env)
        else:
            summary = run_lab(session, c, trainer_args, node_env)
        summaries[c.name].append(summary)
        done = sum(map(len, summaries.values()))
        report(f"[{done}/{len(configs) * options.repeats}] {c.name}: {summary['tokens_per_s']:,.0f} tokens/s, "
               f"compute {summary['compute_ms_per_step']:.1f} ms, all-reduce {summary['allreduce_ms_per_step']:.1f} ms "
               "per step")

    run_rounds(session, names, configs, shaped, options.repeats, run, round(delayed[1] * 1e6) if delayed else 0)
    rows = build_rows(configs, summaries, options.efficiency)
    params = next(iter(summaries.values()))[0].get("params")
    title = (f"{options.workload}: {f'{params:,} parameters, ' if params else ''}"
             f"micro-batch {options.micro_batch} per process, {options.threads} thread(s) per process, "
             f"{options.steps} steps, {session.cpus} CPUs")
    meta = {"workload": options.workload, "steps": options.steps, "micro_batch": options.micro_batch,
            "threads": options.threads, "repeats": options.repeats, "efficiency": options.efficiency,
            "host_gpu": gpu, "notes": notes}
    paths = write_outputs(rows, out, title, meta, plots=plots)
    report("wrote " + ", ".join(str(p) for p in paths))
    return ScalingReport(rows, title, paths, notes)


def plots_possible(report: Callable[[str], None]) -> bool:
    """Whether the PNGs can be drawn; where not, said once: the table is the result, the PNGs only draw it."""
    if have_matplotlib():
        return True
    report(f"matplotlib is not installed: scaling.md and scaling.json only, no PNGs ({INSTALL_HINT})")
    return False


def host_side(session: LabSession, host_python: str, host: bool, gpu_nodes: int,
              report: Callable[[str], None]) -> tuple[str | None, list[str]]:
    """(this machine's GPU for the 1-GPU row, or None; the notes the report carries) for the host rows."""
    gpu, notes = None, []
    if host:
        report(f"host rows: {host_python}, torch {host_torch(host_python)}")
        gpu = host_gpu(host_python)
        report(f"host GPU: {gpu}: the 1-GPU row runs on it (nccl, world size 1)" if gpu else NO_GPU_NOTE)
        notes = [] if gpu else [NO_GPU_NOTE]
    if gpu_nodes < 2 and gpu:  # a GPU here, but the lab's nodes were brought up without theirs
        notes.append(no_gpu_nodes_note(session.name, gpu_nodes))
        report(notes[-1])
    return gpu, notes


def leading_gpu_nodes(nodes) -> int:
    """How many of the lab's first nodes (node0, node1, ...) have a GPU: the lab rows run on the first N."""
    count = 0
    for node in sorted(nodes, key=lambda n: n.rank):
        if not getattr(node, "gpus", ""):
            break
        count += 1
    return count


def lab_for(session: LabSession, nodes_list: str | Sequence[int] | None) -> tuple[list[str], list[int], int]:
    """The running lab's nodes, the node counts to run and how many of its first nodes have a GPU,
    refusing counts it lacks and shaped links."""
    nodes = session.running()
    if not nodes_list:
        counts = list(range(1, len(nodes) + 1))
    else:
        counts = parse_nodes_list(nodes_list) if isinstance(nodes_list, str) else list(nodes_list)
    if max(counts) > len(nodes):
        raise ConfigError("--nodes-list", nodes_list,
                          f"asks for {max(counts)} nodes but lab {session.name} has {len(nodes)}",
                          hint=f"labctl up --lab {session.name} --nodes {max(counts)}, or a shorter list")
    names = [n.name for n in nodes]
    links = netshape.read_links(session.client, session.name, names, session.config.iface)
    if any(state.rate_bps or state.routes for state in links.values()):
        raise StateError(f"lab {session.name} has shaped links; the unshaped rows need them clear",
                         hint=f"labctl shape --lab {session.name} --clear (bench scaling shapes and clears links itself)")
    return names, counts, leading_gpu_nodes(nodes)


def run_rounds(session: LabSession, names: list[str], configs: list[Config], shaped: list[tuple[str, int]],
               repeats: int, run: Callable[[Config], None], delay_us: int = 0) -> None:
    """`repeats` rounds over the rows: in each, the unshaped rows, then for each rate every node's
    link shaped to it (and delayed by `delay_us`), its rows, and the links cleared. Cleared again at
    the end, whatever happened."""
    iface = session.config.iface
    try:
        for _ in range(repeats):
            for c in configs:
                if c.rate_bps is None:
                    run(c)
            for _bw, rate in shaped:
                netshape.apply_shape(session.client, session.name, names, Shape(rate, delay_us=delay_us), iface)
                for c in configs:
                    if c.rate_bps == rate:
                        run(c)
                netshape.clear_shape(session.client, session.name, names, iface)
    finally:
        if shaped:
            netshape.clear_shape(session.client, session.name, names, iface)


# ------------------------------------------------------------------------------ one run


def parse_summary(lines: list[str]) -> dict:
    summary = find_summary(reversed(lines))
    if summary is None:
        raise RunFailed("the trainer printed no SUMMARY line; see the run's logs")
    return summary


def host_torch(python: str) -> str:
    """The torch release of the Python that runs the host rows, or a clear error saying how to get one.
    Asked of that interpreter in a subprocess: labctl's own environment needs no torch."""
    try:
        probe = run([python, "-c", "import torch; print(torch.__version__)"], check=False, timeout_s=120)
    except CommandError as exc:  # the interpreter itself is missing or hangs
        raise LabError(f"cannot run the host rows' Python {python}: {exc}",
                       hint="set DDPLAB_HOST_PYTHON to a Python that has torch, or pass --no-host") from None
    if probe.returncode != 0:
        reason = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        raise StateError(f"the host rows run the trainer on this machine with {python}, which cannot import torch ({reason})",
                         hint="`make host-torch` installs torch's CPU build into .venv (or pip install -e '.[trainer]'); "
                            "or set DDPLAB_HOST_PYTHON to a Python that has torch; or pass --no-host for the lab's rows only")
    return probe.stdout.strip()


def host_gpu(python: str) -> str | None:
    """The name of the GPU the host rows' Python would train on (its torch has CUDA and sees a device),
    or None. Asked of that interpreter, as host_torch is; any failure is no GPU."""
    code = ("import torch; ok = torch.cuda.is_available() and torch.cuda.device_count() > 0; "
            "print('gpu=' + (torch.cuda.get_device_name(0) if ok else ''))")
    try:
        probe = run([python, "-c", code], check=False, timeout_s=120)
    except CommandError:
        return None
    found = [line[len("gpu="):] for line in probe.stdout.splitlines() if line.startswith("gpu=")]
    return (found[-1].strip() or None) if probe.returncode == 0 and found else None


def run_host(config: Config, trainer_args: list[str], run_dir: Path, threads: int, python: str = sys.executable,
             kernels: Mapping[str, str] | None = None) -> dict:
    """The trainer on the host: one plain process, or torchrun --standalone with N; the 1-GPU row
    (config.device "cuda") as torchrun --standalone with 1, on nccl. The CPU rows see no GPU.
    `kernels`: the lab's CPU kernel settings (LabSpec.node_env), so host and lab rows compute alike."""
    cuda = config.device == "cuda"
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env.update(kernels or {})
    env.update(OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    if not cuda:
        env["CUDA_VISIBLE_DEVICES"] = ""
    # labctl's own trainer (the checkout's, or the installed package's copy), whichever Python runs it
    # (DDPLAB_HOST_PYTHON need not have ddplab installed).
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(assets.trainer_path_entry()), env.get("PYTHONPATH")) if p)
    args = [*trainer_args, "--run-dir", str(run_dir), "--backend", "nccl" if cuda else "gloo"]
    if config.nproc_per_node == 1 and not cuda:
        argv = [python, "-m", "trainer", *args]
    else:
        # --log-dir: torchrun's per-attempt folders go into the run's, not into a /tmp/torchelastic_* of their own
        argv = [python, "-m", "torch.distributed.run", "--standalone", "--log-dir", str(run_dir / "torchrun"),
                "--nproc-per-node", str(config.nproc_per_node), "-m", "trainer", *args]
    run_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=HOST_TIMEOUT_S)
    (run_dir / "host.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise CommandError(argv, proc.returncode, proc.stdout, proc.stderr)
    return parse_summary(proc.stdout.splitlines())


def run_lab(session: LabSession, config: Config, trainer_args: list[str], node_env: dict | None = None) -> dict:
    """The trainer on the lab's first `config.nodes` nodes with torchrun, output to the run's logs only:
    on nccl for a GPU row, else on gloo and the CPU, whatever backend the lab's env files name."""
    node_env = node_env if node_env is not None else session.node_env()
    subset = dict(list(node_env.items())[: config.nodes])
    backend = "nccl" if config.device == "cuda" else "gloo"
    plan = session.plan_run("-m", "trainer", *trainer_args, "--backend", backend,
                            options=RunOptions(nproc_per_node=config.nproc_per_node, pg_timeout_s=None),
                            node_env=subset, share_cpus=False)
    return parse_summary(session.execute(plan, echo=False).outcomes[0].lines)
