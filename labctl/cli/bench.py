"""Benchmarks and the cost model: cost, bench up|allreduce|collectives|scaling|predict|straggler."""

from __future__ import annotations

from pathlib import Path

import click

from labctl.api import bench as benches
from labctl.api.inputs import OVERLAYS
from labctl.cli.app import CONTEXT, invocation, main
from labctl.cli.lazy import render_bench
from labctl.cli.options import FilePath, lab_option, nccl_debug_option, package_options
from labctl.core.outfile import is_stdout
from labctl.core.ui import info
from labctl.spec.labspec import parse_cpu_limit, parse_nodes_list
from labctl.spec.units import parse_size_range

# ------------------------------------------------------------------------------------------ cost


@main.command(context_settings=CONTEXT)
@click.option("--params", metavar="N", help="Parameters of the model: 760e6, 760M, 1.3B (needed but with --from-run).")
@click.option("--dtype", type=click.Choice(["fp32", "bf16", "fp16"]), default="bf16", show_default=True,
              help="Gradient dtype on the wire.")
@click.option("--nodes", "ranks", metavar="N", help="Ranks in the collective [default: the lab's world size].")
@click.option("--link", "links", multiple=True, metavar="RATE",
              help="Preset (1GbE, 2.5GbE, 10GbE, 100G-RoCE, 400G-RoCE, NVLink) or a rate; repeatable [default: the lab's shaped link and every preset].")
@click.option("--delay", metavar="TIME", help="One-way delay added to every link's per-hop latency, e.g. 10ms.")
@click.option("--compute-s", type=float, metavar="T", help="Compute (forward+backward) seconds per micro-step.")
@click.option("--collective", type=click.Choice(["allreduce", "reduce_scatter", "allgather"]), default="allreduce",
              show_default=True)
@click.option("--strategy", type=click.Choice(["ddp", "zero", "fsdp", "hsdp", "pp", "tp"]),
              help="Price a whole optimizer step of this strategy (the trainer's --strategy): every collective it "
                   "sends, and what one rank holds. pp: a pipeline, a stage on each rank (needs --activations); "
                   "tp: each layer shared by a node's ranks (needs --activations, --layers, --nproc-per-node 2+).")
@click.option("--activations", metavar="B,S,H",
              help="pp, tp: a micro-batch's activations: its sequences, their length, the hidden size.")
@click.option("--layers", type=int, metavar="L", help="tp: the transformer blocks, each all-reducing 4 times a micro-batch.")
@click.option("--nproc-per-node", type=int, default=1, show_default=True, metavar="P",
              help="Ranks on a node, sharing its link; hsdp shards over them.")
@click.option("--backend", type=click.Choice(["nccl", "gloo"]), default="nccl", show_default=True,
              help="Whose algorithms to price: gloo (the lab's CPU nodes) reduce-scatters with an all-reduce.")
@click.option("--grad-accum", type=int, default=1, show_default=True, metavar="K",
              help="Micro-steps per gradient sync (pp, tp: the micro-batches a step).")
@click.option("--efficiency", type=float, default=0.85, show_default=True, help="Fraction of the link rate the stack reaches.")
@click.option("--step", is_flag=True,
              help="Predict a whole optimizer step with the trainer's step model: the compute, the buckets' all-reduce "
                   "overlapping backward, accumulation, the strategy's collectives; needs --compute-s or --flops and --tokens.")
@click.option("--flops", type=float, metavar="RATE", help="--step: FLOP/s one rank reaches; compute = 6 x params x --tokens / RATE.")
@click.option("--tokens", type=float, metavar="N", help="--step: tokens in one rank's micro-step.")
@click.option("--optimizer-s", type=float, metavar="T", help="--step: the optimizer's seconds a step [default: 0].")
@click.option("--bucket-cap-mb", type=float, metavar="MIB", help="--step: DDP's bucket size [default: 25].")
@click.option("--from-run", "from_run", metavar="RUN",
              help="Price a trainer run's own step (its model, buckets, compute and ranks, as its prediction took them) "
                   "on its calibrated link, where it gives the run's prediction, and on each --link (default: every preset).")
@click.option("--overlay", type=click.Choice(OVERLAYS), default=None,
              help="Price each link with a mesh VPN's tunnel on it: its headers at its MTU, and on the lab's own "
                   "link the ceiling `labctl bench allreduce` measured for it [default: the lab's overlay, if any].")
@click.option("--tunnel-rate", metavar="RATE",
              help="The tunnel's own ceiling a hop (its encryption's), on every link, e.g. 180mbit.")
@lab_option
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
def cost(params, dtype, ranks, links, delay, compute_s, collective, strategy, activations, layers, nproc_per_node,
         backend, grad_accum, efficiency, step, flops, tokens, optimizer_s, bucket_cap_mb, from_run, overlay,
         tunnel_rate, lab, as_json) -> None:
    """What one gradient synchronisation, or one optimizer step of a strategy, costs on each link.

    Bytes through each rank's NIC: 2(n-1)/n x S for a ring allreduce, (n-1)/n x S for
    reduce-scatter or all-gather (S = params x dtype bytes); time = bytes / (rate x efficiency)
    + 2(n-1) x alpha, where alpha is the link's typical latency plus --delay. --strategy zero adds
    an all-gather of the updated parameters to DDP's allreduce; fsdp sends two all-gathers and a
    reduce-scatter: 1.5x DDP's bytes, each, for less state on each rank. --backend gloo prices
    what gloo does: its reduce-scatter is an all-reduce, so fsdp sends 2x DDP's bytes there.
    --step predicts the whole step instead (labctl/bench/stepcost.py), each term shown.
    --from-run RUN takes a trainer run's own step (its model, buckets, compute and ranks): on its
    own calibrated link it gives the run's prediction, and on each --link what the same step costs.
    """
    if from_run is not None:
        given = {"--params": params, "--nodes": ranks, "--compute-s": compute_s, "--strategy": strategy, "--flops": flops,
                 "--tokens": tokens, "--optimizer-s": optimizer_s, "--bucket-cap-mb": bucket_cap_mb}
        query = benches.CostQuery(0.0, links=links, efficiency=efficiency, delay=delay)
        render_bench.print_cost(benches.cost_of_run(invocation().lab(lab), from_run, query, given), as_json)
        return
    count = benches.parse_params(params)
    step_query = benches.step_query(step, compute_s, flops, tokens, optimizer_s, bucket_cap_mb)
    query = benches.CostQuery(count, dtype, ranks, links, compute_s, grad_accum, efficiency, collective, delay,
                              strategy, backend, nproc_per_node, overlay, tunnel_rate, activations, layers)
    session = invocation().lab(lab)
    report = benches.estimate_step(query, step_query, session) if step_query else benches.estimate(query, lab=session)
    render_bench.print_cost(report, as_json)


# ----------------------------------------------------------------------------------------- bench


def up_package_args(requirements: str | None, with_packages: tuple[str, ...]) -> list[str]:
    """`labctl up`'s arguments for the packages a bench's lab gets (a relative FILE from where you stand)."""
    args = ["--requirements", str(Path(invocation().cwd) / requirements)] if requirements else []
    return args + [a for requirement in with_packages for a in ("--with", requirement)]


@main.group(context_settings=CONTEXT)
def bench() -> None:
    """Benchmarks: ratios measured side by side in one run (docs/explanation/measurements.md has ours)."""


@bench.command("up", context_settings=CONTEXT)
@click.option("--nodes-list", default="3,16", show_default=True, metavar="N,N,...", help="Lab sizes to time.")
@click.option("--repeats", type=click.IntRange(1, 20), default=3, show_default=True, help="Timed runs of each, alternated.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as a JSON list.")
@package_options
def bench_up_cmd(nodes_list, repeats, as_json, requirements, with_packages) -> None:
    """Time `labctl up --nodes N` against a raw `docker compose up -d` of the same generated file.

    Uses a lab named bench-up (image must be built), removed at the end. Reports medians and
    their ratio; the two are alternated so a change in the machine's load hits both alike.

    With --requirements or --with, `labctl up` with those packages joins the rounds (its lock and
    package image already made: an `up` with unchanged requirements), and the first such `up` is
    timed once from nothing (a cache folder of its own, the package image removed).
    """
    counts = parse_nodes_list(nodes_list)
    results = invocation().here().bench_up(counts, repeats, packages=up_package_args(requirements, with_packages))
    render_bench.print_up_timings(results, repeats, as_json)


@bench.command("start", context_settings=CONTEXT)
@click.option("--nodes", type=click.IntRange(1, 64), default=3, show_default=True, help="Nodes of the bench's lab.")
@click.option("--rounds", type=click.IntRange(1, 20), default=5, show_default=True,
              help="Timed runs of every way, alternated; medians are reported.")
@click.option("--torchx", metavar="COMMAND", help="Also time TorchX's local_docker scheduler with this torchx command "
                                                  "(pip install torchx).")
@click.option("--json", "as_json", is_flag=True, help="Print the timings as JSON.")
@package_options
@click.option("--preload", multiple=True, metavar="MODULE", help="Modules the bench lab's fork servers import too "
                                                                 "(as `up --preload`).")
def bench_start_cmd(nodes, rounds, torchx, as_json, requirements, with_packages, preload) -> None:
    """What a run costs from the shell to its last process's exit, every way of starting one.

    A no-op DDP script (join, barrier, leave) through `labctl run` warm, static and under torchrun;
    the same by hand with `docker exec` on every node; a typical DDP tutorial train.py for one epoch,
    warm and under torchrun; TorchX with --torchx. And what a user meets first: each round begins
    with the lab down, then `labctl up` and at once its first warm run, timed together. On a lab
    named bench-start, removed at the end; with --requirements/--with (and --preload), a lab with
    those packages.
    """
    report = invocation().here().bench_start(nodes, rounds, torchx, up_package_args(requirements, with_packages),
                                             tuple(preload))
    render_bench.print_start(report, as_json)


def sweep_options(json_help: str, plot_lines: str):
    """The options bench allreduce and bench collectives share: sizes, iterations, the model's
    efficiency, --json and --plot."""
    options = [
        click.option("--sizes", default="1K:64M", show_default=True, metavar="LO:HI|S,S",
                     help="Message sizes (1024-based K/M/G): a doubling range LO:HI or a list."),
        click.option("--iters", type=click.IntRange(1, 1000), default=5, show_default=True,
                     help="Timed iterations per size."),
        click.option("--efficiency", type=click.FloatRange(0.01, 1.0), default=0.85, show_default=True,
                     help="Efficiency the cost model assumes."),
        click.option("--json", "as_json", is_flag=True, help=json_help),
        click.option("--plot", "plot_path", type=FilePath(dir_okay=False, path_type=Path),
                     help=f"Write a PNG of busbw against size{plot_lines}; - for standard output (the table then "
                          "goes to stderr)."),
    ]

    def apply(command):
        for option in reversed(options):
            command = option(command)
        return command

    return apply


@bench.command("allreduce", context_settings=CONTEXT)
@lab_option
@sweep_options("Print the rows as a JSON list.", "")
@nccl_debug_option
def bench_allreduce_cmd(lab, sizes, iters, efficiency, as_json, plot_path, nccl_debug) -> None:
    """An nccl-tests-style allreduce sweep across the lab's nodes, beside the cost model and the wire.

    time = median over iterations of the per-iteration maximum over ranks; algbw = S/t;
    busbw = algbw x 2(n-1)/n; model = the ring cost model at the slowest shaped link (or the
    iperf3-measured wire when unshaped); busbw/wire = the collective stack's efficiency.
    """
    if as_json and is_stdout(plot_path):
        raise click.UsageError("--json and --plot - both want standard output; give --plot a file name")
    size_list = parse_size_range(sizes)
    env = benches.NCCL_DEBUG_ENV if nccl_debug else None
    report = benches.allreduce(invocation().lab(lab), size_list, iters, efficiency, info, plot_path, env)
    render_bench.print_allreduce(report, as_json, to_stderr=is_stdout(plot_path))


@bench.command("collectives", context_settings=CONTEXT)
@lab_option
@click.option("--ops", default="all_reduce,all_gather,reduce_scatter,broadcast,all_to_all", show_default=True,
              metavar="OP,OP", help="Which collectives, comma-separated.")
@sweep_options("Print the rows as a JSON list (op, size, busbw_gbs, ...).", ", a line per op")
@nccl_debug_option
def bench_collectives_cmd(lab, ops, sizes, iters, efficiency, as_json, plot_path, nccl_debug) -> None:
    """nccl-tests' sweeps (all_reduce_perf, all_gather_perf, ...) across the lab's nodes, each op
    beside the cost model, the calibrated model and the wire.

    Sizes as nccl-tests counts them: the tensor for all_reduce and broadcast, the gathered output
    for all_gather, the input for reduce_scatter and all_to_all. busbw = algbw x 2(n-1)/n for
    all_reduce, (n-1)/n for all_gather, reduce_scatter and all_to_all, 1 for broadcast. The models
    price what the backend runs: gloo's reduce-scatter is an all-reduce of the whole input, its
    broadcast a binomial tree (docs/explanation/cost-model.md).
    """
    if as_json and is_stdout(plot_path):
        raise click.UsageError("--json and --plot - both want standard output; give --plot a file name")
    op_list = [op.strip() for op in ops.split(",") if op.strip()]
    env = benches.NCCL_DEBUG_ENV if nccl_debug else None
    report = benches.collectives(invocation().lab(lab), op_list, parse_size_range(sizes), iters, efficiency, info,
                                 plot_path, env)
    render_bench.print_allreduce(report, as_json, to_stderr=is_stdout(plot_path))


@bench.command("scaling", context_settings=CONTEXT)
@lab_option
@click.option("--workload", type=click.Choice(["gpt", "toy"]), default="gpt", show_default=True, help="What to train.")
@click.option("--nodes-list", metavar="N,N,...", help="Node counts to run [default: 1 up to the lab's size].")
@click.option("--bw", "rates", multiple=True, metavar="RATE",
              help="Link rate for the shaped rows (repeatable) [default: 1gbit and 100mbit]; 'none' for no shaped rows.")
@click.option("--delay", metavar="TIME",
              help="One-way delay added to the shaped rows' links, e.g. 10ms (needs the kernel's netem).")
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
@click.option("--out", "out_dir", type=FilePath(file_okay=False, path_type=Path),
              help="Where to write scaling.md, scaling.json and the plots [default: .lab/<lab>/bench-scaling].")
@click.option("--json", "as_json", is_flag=True,
              help='Print {"rows": [{"name", "nodes", "nproc_per_node", "bw", "tokens_per_s", ...}]}.')
def bench_scaling_cmd(lab, workload, nodes_list, rates, delay, nproc, steps, micro_batch, threads, repeats,
                      efficiency, no_host, out_dir, as_json) -> None:
    """Tokens/s for 1 process, P processes on one node, N nodes, and N nodes on shaped links.

    Each row gives the measured all-reduce ms per step beside the ring cost model's, the ratio of
    communication to compute, and the scaling efficiency against 1 process. The lab must be up
    with at least the largest node count, and unshaped: rows are shaped and cleared here.
    """
    options = benches.ScalingOptions(workload=workload, nodes_list=nodes_list, rates=rates, delay=delay, nproc=nproc,
                                     steps=steps, micro_batch=micro_batch, threads=threads, repeats=repeats,
                                     efficiency=efficiency, host=not no_host)
    report = benches.scaling(invocation().lab(lab), options, out_dir=out_dir, report=info)
    render_bench.print_scaling(report, as_json)


@bench.command("predict", context_settings=CONTEXT)
@lab_option
@click.option("--steps", type=click.IntRange(3, 10_000), default=30, show_default=True, help="Optimizer steps per run.")
@click.option("--repeats", type=click.IntRange(1, 20), default=3, show_default=True,
              help="Runs of each case, in rounds; its row is their median prediction against their median step, "
                   "with the spread of the runs' own errors.")
@click.option("--out", "out_dir", type=FilePath(file_okay=False, path_type=Path),
              help="Where to write predict.md, predict.json and predict.png [default: .lab/<lab>/bench-predict].")
@click.option("--json", "as_json", is_flag=True, help="Print the rows and the error's statistics as JSON.")
def bench_predict_cmd(lab, steps, repeats, out_dir, as_json) -> None:
    """The step model against the steps it predicts, over a grid of configurations.

    Runs make demo's own run (the toy workload on 3 nodes), then the trainer's gpt on the lab's first
    2, 4 and 8 nodes, unshaped and at 1gbit and 100mbit, with accumulation, buckets of 1 and 25 MiB,
    2 ranks a node, a straggler, the sharded strategies, two groups of nodes joined by 100mbit, a
    pipeline of a stage a node on 3 and tensor parallelism over 2 ranks a node on 2 (the cases the lab
    has nodes for: 15 on 2 nodes, 19 on 3, 33 on 4, all 39 on 8), and prints each case's
    predicted and measured step with its runs' spread, and the median and 90th percentile of the
    absolute error of the cases predicted (a case too short to predict is counted apart).
    The lab's links must be unshaped: the bench shapes and clears them itself.
    """
    result = benches.predict(invocation().lab(lab), steps, repeats, out_dir=out_dir, report=info)
    render_bench.print_predict(result, as_json)


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
@click.option("--out", "out_dir", type=FilePath(file_okay=False, path_type=Path),
              help="Where to write straggler-timeline.png [default: .lab/<lab>/bench-straggler].")
@click.option("--pipeline", "pipeline", type=click.IntRange(2, 256), default=None, metavar="BLOCKS",
              help="Also run a pipeline (the trainer's --strategy pp, a stage a node), on equal stages and on stages "
                   "sized by each node's speed (--stage-layers auto); every run trains gpt of BLOCKS blocks.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def bench_straggler_cmd(lab, node, cpus, workload, micro_batch, steps, repeats, out_dir, pipeline, as_json) -> None:
    """One slow node, before and after balancing the work with --rank-micro-batch.

    Slows NODE to --cpus, trains with an even split of the global batch, measures each rank's
    compute time per sample, gives each rank a share of the same global batch in proportion to
    its speed, and trains again: same samples per step, same gradient, less waiting. The node's
    CPU limit is put back at the end. The median runs' timelines, before and after, go side by side
    into straggler-timeline.png (`labctl trace` draws each run's own). With --pipeline, a pipeline of
    equal stages and one sized by speed run in each round too (pipeline-timeline.png).
    """
    limit = parse_cpu_limit(cpus, "--cpus")
    options = benches.StragglerOptions(node=node, cpus=limit, workload=workload, micro_batch=micro_batch, steps=steps,
                                       repeats=repeats, pipeline=pipeline)
    result = benches.straggler(invocation().lab(lab), options, out_dir=out_dir, report=info)
    render_bench.print_straggler(result, as_json)
