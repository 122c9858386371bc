"""Benchmarks and the cost model: cost, bench up|allreduce|scaling|straggler."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from labctl.cli.app import CONTEXT, main, session
from labctl.cli.options import lab_option


# ------------------------------------------------------------------------------------------ cost


@main.command(context_settings=CONTEXT)
@click.option("--params", required=True, metavar="N", help="Parameters of the model: 760e6, 760M, 1.3B.")
@click.option("--dtype", type=click.Choice(["fp32", "bf16", "fp16"]), default="bf16", show_default=True,
              help="Gradient dtype on the wire.")
@click.option("--nodes", "ranks", metavar="N", help="Ranks in the collective [default: the lab's world size].")
@click.option("--link", "links", multiple=True, metavar="RATE",
              help="Preset (1GbE, 2.5GbE, 10GbE, 100G-RoCE, 400G-RoCE, NVLink) or a rate; repeatable [default: the lab's shaped link and every preset].")
@click.option("--compute-s", type=float, metavar="T", help="Compute (forward+backward) seconds per micro-step.")
@click.option("--collective", type=click.Choice(["allreduce", "reduce_scatter", "allgather"]), default="allreduce",
              show_default=True)
@click.option("--grad-accum", type=int, default=1, show_default=True, metavar="K", help="Micro-steps per gradient sync.")
@click.option("--efficiency", type=float, default=0.85, show_default=True, help="Fraction of the link rate the stack reaches.")
@lab_option
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
def cost(params, dtype, ranks, links, compute_s, collective, grad_accum, efficiency, lab, as_json) -> None:
    """What one gradient synchronisation costs on each link, from first principles.

    Bytes through each rank's NIC: 2(n-1)/n x S for a ring allreduce, (n-1)/n x S for
    reduce-scatter or all-gather (S = params x dtype bytes); time = bytes / (rate x efficiency)
    + 2(n-1) x alpha.
    """
    from rich.table import Table

    from labctl.bench.cost import PRESETS, Link, parse_params, resolve_link, step_report
    from labctl.errors import ConfigError
    from labctl.ui import console, info

    count = parse_params(params)
    lab_link, lab_world = _lab_link(lab)
    if ranks is None and lab_world is None:
        raise ConfigError("--nodes", None, "is needed outside a running lab", hint="labctl cost --params 760e6 --nodes 2")
    try:
        # Any cluster size: the calculator is for the real cluster, not only for this lab.
        n = int(ranks) if ranks is not None else lab_world
    except ValueError:
        n = 0
    if not 1 <= n <= 1_000_000:
        raise ConfigError("--nodes", ranks, "must be a whole number of ranks from 1 to 1000000")
    chosen = [resolve_link(text) for text in links]
    if not chosen:
        chosen = ([Link(f"lab ({lab_link[0]})", float(lab_link[1]), 50e-6)] if lab_link else []) + list(PRESETS.values())
    rows = step_report(count, dtype, n, chosen, compute_s, grad_accum, efficiency, collective)
    if as_json:
        click.echo(json.dumps(rows))
        return
    payload = rows[0]["payload_bytes"]
    table = Table(title=f"{collective} of {count:g} {dtype} params ({payload / 1e9:.3g} GB) over {n} ranks, "
                        f"at {efficiency:.0%} of each link", title_justify="left")
    columns = ["link", "rate", "bytes/rank", "time/sync"] + (["comm/compute", "step (no overlap)"] if compute_s else [])
    for column in columns:
        table.add_column(column, justify="right" if column != "link" else "left")
    for row in rows:
        cells = [row["link"], f"{row['rate_bps'] / 1e9:g} Gbit/s", f"{row['bytes_per_rank'] / 1e9:.3g} GB", _seconds(row["comm_s"])]
        if compute_s:
            cells += [f"{row['comm_over_compute']:.3g}", _seconds(row["step_s_no_overlap"])]
        table.add_row(*cells)
    console.print(table)
    if compute_s and grad_accum == 1:
        info("with --grad-accum K the same sync is paid once per K micro-steps: comm/compute falls K-fold")


def _seconds(value: float) -> str:
    return f"{value:.3g} s" if value >= 1 else f"{value * 1e3:.3g} ms"


def _lab_link(lab: str | None):
    """(description, rate) of a running lab's slowest shaped link, and its world size; Nones outside a lab."""
    from labctl.lab import lifecycle
    from labctl.net import apply as netshape
    from labctl.errors import LabError
    from labctl.units import format_rate

    config = session().config(lab=lab)
    try:
        client = session().client
        nodes = [n.name for n in lifecycle.require_running(client, config.lab)]
    except LabError:
        return None, None
    world = len(nodes) * config.nproc_per_node
    bottleneck = netshape.slowest_link(netshape.read_links(client, config.lab, nodes, config.iface))
    return ((format_rate(bottleneck[1]), bottleneck[1]) if bottleneck else None), world


# ----------------------------------------------------------------------------------------- bench


@main.group(context_settings=CONTEXT)
def bench() -> None:
    """Benchmarks whose numbers go in the README (ratios measured side by side in one run)."""


def _nodes_list(raw: str) -> list[int]:
    from labctl.config import SETTINGS
    from labctl.errors import ConfigError

    parse = SETTINGS["nodes"][1]
    try:
        values = [parse(part) for part in raw.split(",") if part.strip()]
    except ValueError as exc:
        raise ConfigError("--nodes-list", raw, f"each count {exc}") from None
    if not values:
        raise ConfigError("--nodes-list", raw, "must list node counts, comma-separated, e.g. 3,16")
    return values


@bench.command("up", context_settings=CONTEXT)
@click.option("--nodes-list", default="3,16", show_default=True, metavar="N,N,...", help="Lab sizes to time.")
@click.option("--repeats", type=click.IntRange(1, 20), default=3, show_default=True, help="Timed runs of each, alternated.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as a JSON list.")
def bench_up_cmd(nodes_list, repeats, as_json) -> None:
    """Time `labctl up --nodes N` against a raw `docker compose up -d` of the same generated file.

    Uses a lab named bench-up (image must be built), removed at the end. Reports medians and
    their ratio; the two are alternated so a change in the machine's load hits both alike.
    """
    from rich.table import Table

    from labctl.bench.up import bench_up
    from labctl.ui import console, info

    counts = _nodes_list(nodes_list)
    client = session().client
    results = bench_up(client, session().workspace, counts, repeats, info)
    if as_json:
        click.echo(json.dumps([r.as_dict() for r in results]))
        return
    table = Table(title=f"labctl up vs docker compose up -d (median of {repeats})", title_justify="left")
    for column in ("nodes", "labctl up (s)", "compose up -d (s)", "ratio"):
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(str(r.nodes), f"{r.labctl_s:.2f}", f"{r.compose_s:.2f}", f"{r.ratio:.2f}")
    console.print(table)


@bench.command("allreduce", context_settings=CONTEXT)
@lab_option
@click.option("--sizes", default="1K:64M", show_default=True, metavar="LO:HI|S,S",
              help="Message sizes (1024-based K/M/G): a doubling range LO:HI or a list.")
@click.option("--iters", type=click.IntRange(1, 1000), default=5, show_default=True, help="Timed iterations per size.")
@click.option("--efficiency", type=click.FloatRange(0.01, 1.0), default=0.85, show_default=True,
              help="Efficiency the cost model assumes.")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as a JSON list.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), help="Write a PNG of busbw against size.")
def bench_allreduce_cmd(lab, sizes, iters, efficiency, as_json, plot_path) -> None:
    """An nccl-tests-style allreduce sweep across the lab's nodes, beside the cost model and the wire.

    time = median over iterations of the per-iteration maximum over ranks; algbw = S/t;
    busbw = algbw x 2(n-1)/n; model = the ring cost model at the slowest shaped link (or the
    iperf3-measured wire when unshaped); busbw/wire = the collective stack's efficiency.
    """
    from rich.table import Table

    from labctl.lab import lifecycle
    from labctl.lab.session import LabSession
    from labctl.bench import allreduce as linkbench
    from labctl.net import apply as netshape
    from labctl.units import format_rate, parse_size_range
    from labctl.ui import console, info

    size_list = parse_size_range(sizes)
    config = session().config(lab=lab)
    client = session().client
    nodes = lifecycle.require_running(client, config.lab)
    if len(nodes) < 2:
        from labctl.errors import LabError

        raise LabError(f"lab {config.lab} has {len(nodes)} node; an allreduce across nodes needs 2 or more",
                       hint=f"labctl up --lab {config.lab} --nodes 3")
    names = [n.name for n in nodes]
    node_env = LabSession(config, session().workspace, client).node_env(names)
    bottleneck = netshape.slowest_link(netshape.read_links(client, config.lab, names, config.iface))
    slowest, link_bps = bottleneck or (names[0], None)
    neighbour = names[(names.index(slowest) + 1) % len(names)]
    ip_of = {n.name: n.ip for n in nodes}
    info(f"measuring the wire {slowest} -> {neighbour} with iperf3 ({linkbench.IPERF_SECONDS} s)")
    wire_bps = linkbench.measure_wire(client, config.lab, slowest, neighbour, ip_of[neighbour])
    info(f"allreduce sweep on {len(names)} nodes, {len(size_list)} sizes x {iters} iterations")
    run_dir, timings = linkbench.run_sweep(LabSession(config, session().workspace, client), node_env, size_list, iters)
    link = linkbench.model_link(link_bps, wire_bps)
    rows = linkbench.build_rows(timings, len(names), link, wire_bps, efficiency)
    (run_dir / "bench-allreduce.json").write_text(json.dumps([r.as_dict() for r in rows]))
    link_text = f"shaped {format_rate(link_bps)} (slowest node {slowest})" if link_bps else "unshaped"
    title = (f"allreduce, {len(names)} nodes, link {link_text}, iperf3 wire {wire_bps / 1e6:.0f} Mbit/s; "
             f"model: ring at {efficiency:.0%} of {'the link' if link_bps else 'the wire'}")
    if plot_path:
        linkbench.plot(rows, plot_path, link_bps, wire_bps, len(names), title.split(";")[0])
        info(f"plot written to {plot_path}")
    if as_json:
        click.echo(json.dumps([r.as_dict() for r in rows]))
        return
    table = Table(title=title, title_justify="left")
    for column in ("size(B)", "count", "type", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "model(us)", "meas/model", "busbw/wire"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(str(r.size), str(r.count), r.type, f"{r.time_us:.1f}", f"{r.algbw_gbs:.4f}", f"{r.busbw_gbs:.4f}",
                      f"{r.model_us:.1f}" if r.model_us else "-", f"{r.meas_over_model:.2f}" if r.meas_over_model else "-",
                      f"{r.busbw_over_wire:.2f}" if r.busbw_over_wire else "-")
    console.print(table)


@bench.command("scaling", context_settings=CONTEXT)
@lab_option
@click.option("--workload", type=click.Choice(["gpt", "toy"]), default="gpt", show_default=True, help="What to train.")
@click.option("--nodes-list", metavar="N,N,...", help="Node counts to run [default: 1 up to the lab's size].")
@click.option("--bw", "rates", multiple=True, metavar="RATE",
              help="Link rate for the shaped rows (repeatable) [default: 1gbit and 100mbit]; 'none' for no shaped rows.")
@click.option("--nproc", type=click.IntRange(1, 32), default=None, metavar="P",
              help="Processes for the one-node row [default: the largest node count; 1 = no such row].")
@click.option("--steps", type=click.IntRange(2, 10_000), default=40, show_default=True,
              help="Optimizer steps per row (the first is warm-up and not measured).")
@click.option("--micro-batch", type=click.IntRange(1, 4096), default=8, show_default=True,
              help="Samples per process per step (weak scaling: the global batch grows with the processes).")
@click.option("--threads", type=click.IntRange(1, 256), default=1, show_default=True, help="CPU threads per process.")
@click.option("--repeats", type=click.IntRange(1, 20), default=1, show_default=True,
              help="Rounds over all rows; each row reports its median.")
@click.option("--efficiency", type=click.FloatRange(0.01, 1.0), default=0.85, show_default=True,
              help="Efficiency the cost model assumes.")
@click.option("--no-host", is_flag=True, help="Leave out the rows that run on the host.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Where to write scaling.md, scaling.json and the plots [default: .lab/<lab>/bench-scaling].")
@click.option("--json", "as_json", is_flag=True,
              help='Print {"rows": [{"name", "nodes", "nproc_per_node", "bw", "tokens_per_s", ...}]}.')
def bench_scaling_cmd(lab, workload, nodes_list, rates, nproc, steps, micro_batch, threads, repeats, efficiency,
                      no_host, out_dir, as_json) -> None:
    """Tokens/s for 1 process, P processes on one node, N nodes, and N nodes on shaped links.

    Each row gives the measured all-reduce ms per step beside the ring cost model's, the ratio of
    communication to compute, and the scaling efficiency against 1 process. The lab must be up
    with at least the largest node count, and unshaped: rows are shaped and cleared here.
    """
    from labctl.lab import docker as lab_mod
    from labctl.lab import lifecycle
    from labctl.lab.session import LabSession
    from labctl.net import apply as netshape
    from labctl.bench import scaling
    from labctl.errors import ConfigError, LabError
    from labctl.net.tc import Shape
    from labctl.ui import console, info
    from labctl.units import parse_rate

    config = session().config(lab=lab)
    shaped = [] if list(rates) == ["none"] else [(r, parse_rate(r, "--bw")) for r in (rates or ("1gbit", "100mbit"))]
    client = session().client
    nodes = lifecycle.require_running(client, config.lab)
    counts = _nodes_list(nodes_list) if nodes_list else list(range(1, len(nodes) + 1))
    if max(counts) > len(nodes):
        raise ConfigError("--nodes-list", nodes_list, f"asks for {max(counts)} nodes but lab {config.lab} has {len(nodes)}",
                          hint=f"labctl up --lab {config.lab} --nodes {max(counts)}, or a shorter list")
    names = [n.name for n in nodes]
    links = netshape.read_links(client, config.lab, names, config.iface)
    if netshape.slowest_link(links):
        raise LabError(f"lab {config.lab} has shaped links; the unshaped rows need them clear",
                       hint=f"labctl shape --lab {config.lab} --clear (bench scaling shapes and clears links itself)")
    host_python = config.host_python or sys.executable
    if not no_host:
        info(f"host rows: {host_python}, torch {scaling.host_torch(host_python)}")
    configs = scaling.plan(counts, shaped, nproc or max(counts), host=not no_host)
    trainer_args = ["--workload", workload, "--steps", str(steps), "--micro-batch", str(micro_batch),
                    "--threads", str(threads)]
    node_env = LabSession(config, session().workspace, client).node_env(names)
    out = out_dir or lifecycle.lab_dir(session().workspace, config.lab) / "bench-scaling"
    summaries: dict[str, list[dict]] = {c.name: [] for c in configs}
    total = len(configs) * repeats
    done = 0

    def measure(c) -> None:
        nonlocal done
        done += 1
        if c.place == "host":
            summary = scaling.run_host(c, trainer_args, out / "host-runs" / c.name.replace(", ", "-").replace(" ", ""),
                                       threads, host_python)
        else:
            summary = scaling.run_lab(LabSession(config, session().workspace, client), c, trainer_args, node_env)
        summaries[c.name].append(summary)
        info(f"[{done}/{total}] {c.name}: {summary['tokens_per_s']:,.0f} tokens/s, "
             f"compute {summary['compute_ms_per_step']:.1f} ms, all-reduce {summary['allreduce_ms_per_step']:.1f} ms per step")

    try:
        for _ in range(repeats):
            for c in configs:
                if c.rate_bps is None:
                    measure(c)
            for bw, rate in shaped:
                netshape.apply_shape(client, config.lab, names, Shape(rate), config.iface)
                for c in configs:
                    if c.rate_bps == rate:
                        measure(c)
                netshape.clear_shape(client, config.lab, names, config.iface)
    finally:
        if shaped:
            netshape.clear_shape(client, config.lab, names, config.iface)
    rows = scaling.build_rows(configs, summaries, efficiency)
    first = next(iter(summaries.values()))[0]
    size = f"{first.get('params', 0):,} parameters, " if first.get("params") else ""
    title = (f"{workload}: {size}micro-batch {micro_batch} per process, {threads} thread(s) per process, "
             f"{steps} steps, {lab_mod.engine_cpus(client)} CPUs")
    paths = scaling.write_outputs(rows, out, title, {"workload": workload, "steps": steps, "micro_batch": micro_batch,
                                                     "threads": threads, "repeats": repeats, "efficiency": efficiency})
    info("wrote " + ", ".join(str(p) for p in paths))
    if as_json:
        click.echo(json.dumps({"rows": [r.as_dict() for r in rows]}))
        return
    from rich.markdown import Markdown

    console.print(Markdown(scaling.markdown(rows, title)))


@bench.command("straggler", context_settings=CONTEXT)
@lab_option
@click.option("--node", metavar="NODE", help="The node to slow down [default: the lab's last node].")
@click.option("--cpus", default="0.25", show_default=True, metavar="C", help="Its CPU limit during the benchmark.")
@click.option("--workload", type=click.Choice(["gpt", "toy"]), default="gpt", show_default=True, help="What to train.")
@click.option("--micro-batch", type=click.IntRange(1, 4096), default=16, show_default=True,
              help="Samples per rank per step with the even split; the global batch is this x world size.")
@click.option("--steps", type=click.IntRange(3, 10_000), default=30, show_default=True, help="Optimizer steps per run.")
@click.option("--repeats", type=click.IntRange(1, 20), default=2, show_default=True,
              help="Alternated runs of each split; the median is reported.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def bench_straggler_cmd(lab, node, cpus, workload, micro_batch, steps, repeats, as_json) -> None:
    """One slow node, before and after balancing the work with --rank-micro-batch.

    Slows NODE to --cpus, trains with an even split of the global batch, measures each rank's
    compute time per sample, gives each rank a share of the same global batch in proportion to
    its speed, and trains again: same samples per step, same gradient, less waiting. The node's
    CPU limit is put back at the end.
    """
    from rich.table import Table

    from labctl.lab import docker as lab_mod
    from labctl.lab import lifecycle
    from labctl.lab.session import LabSession
    from labctl.bench import scaling
    from labctl.config import parse_cpus
    from labctl.errors import ConfigError, LabError
    from labctl.ui import console, info

    try:
        limit = parse_cpus(cpus)
    except ValueError as exc:
        raise ConfigError("--cpus", cpus, str(exc)) from None
    if limit is None:
        raise ConfigError("--cpus", cpus, "must be a CPU count such as 0.25")
    config = session().config(lab=lab)
    client = session().client
    names = [n.name for n in lifecycle.require_running(client, config.lab)]
    if len(names) < 2:
        raise LabError(f"lab {config.lab} has {len(names)} node; a straggler needs others to wait for it",
                       hint=f"labctl up --lab {config.lab} --nodes 3")
    node = node or names[-1]
    if node not in names:
        raise LabError(f"no node {node!r} in lab {config.lab}", hint=f"nodes: {', '.join(names)}")
    lab_mod.check_cpus(client, {"--cpus": limit})
    node_env = LabSession(config, session().workspace, client).node_env(names)
    every = scaling.Config("all nodes", "lab", len(names), 1)
    global_batch = micro_batch * len(names)
    base_args = ["--workload", workload, "--steps", str(steps), "--global-batch", str(global_batch),
                 "--micro-batch", str(micro_batch), "--threads", "1"]
    before = lab_mod.node_cpus_limit(client, config.lab, node)
    runs: dict[str, list[dict]] = {"even": [], "balanced": []}
    override = None
    lab_mod.apply_node_cpus(client, config.lab, node, limit)
    info(f"{node} limited to {limit:g} CPUs")
    try:
        for round_ in range(1, repeats + 1):
            even = scaling.run_lab(LabSession(config, session().workspace, client), every, base_args, node_env)
            runs["even"].append(even)
            info(f"round {round_}, even split {even['micro_batches']}: {even['tokens_per_s']:,.0f} tokens/s, "
                 f"slowest {even['slowest_node']}, others waited {even['waited_for_slowest_s']:.2f} s")
            if override is None:
                per_sample = scaling.compute_ms_per_sample(Path(even["run_dir"]), even["micro_batches"], even["accum_steps"])
                sizes = scaling.balanced_micro_batches(global_batch, per_sample)
                override = ",".join(f"{rank}={size}" for rank, size in enumerate(sizes))
            balanced = scaling.run_lab(LabSession(config, session().workspace, client), every,
                                       base_args + ["--rank-micro-batch", override], node_env)
            runs["balanced"].append(balanced)
            info(f"round {round_}, balanced {balanced['micro_batches']}: {balanced['tokens_per_s']:,.0f} tokens/s, "
                 f"others waited {balanced['waited_for_slowest_s']:.2f} s")
    finally:
        lab_mod.apply_node_cpus(client, config.lab, node, before)
        info(f"{node} CPU limit restored to {f'{before:g} CPUs' if before else 'none'}")
    result = {"node": node, "cpus": limit, "global_batch": global_batch, "rank_micro_batch": override}
    for split, summaries in runs.items():
        pick = scaling.median_run(summaries)
        result[split] = {k: pick[k] for k in ("micro_batches", "tokens_per_s", "step_ms", "compute_ms_per_step",
                                                "slowest_node", "slowest_compute_ratio", "waited_for_slowest_s",
                                                "final_loss")}
        result[split]["tokens_per_s_runs"] = [s["tokens_per_s"] for s in summaries]
    result["speedup"] = round(result["balanced"]["tokens_per_s"] / result["even"]["tokens_per_s"], 3)
    if as_json:
        click.echo(json.dumps(result))
        return
    table = Table(title=f"{node} at {limit:g} CPUs, global batch {global_batch}, {steps} steps, "
                        f"median of {repeats}", title_justify="left")
    for column in ("split", "micro-batches", "tokens/s", "step ms", "slowest", "slowest/median compute",
                   "others waited (s)", "final loss"):
        table.add_column(column, justify="right")
    for split, label in (("even", "even"), ("balanced", f"--rank-micro-batch {override}")):
        r = result[split]
        table.add_row(label, str(r["micro_batches"]), f"{r['tokens_per_s']:,.0f}", f"{r['step_ms']:.1f}",
                      str(r["slowest_node"]), f"{r['slowest_compute_ratio']:.2f}", f"{r['waited_for_slowest_s']:.2f}",
                      f"{r['final_loss']:.4f}")
    console.print(table)
    console.print(f"balanced / even tokens/s: [bold]{result['speedup']:.2f}x[/bold]", markup=True)
