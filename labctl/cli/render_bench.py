"""What the benches and `labctl cost` print: their tables, the scaling report as Markdown, and JSON.
The rest of the CLI's printing is in render.py, whose helpers these share."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from labctl.bench.predict import error_text, stats_line
from labctl.bench.scaling import markdown
from labctl.cli.render import emit_json, seconds_text
from labctl.core.ui import console, err_console, info


def print_cost(report, as_json: bool) -> None:
    """`cost`: one row per link, and the hint about --grad-accum when a step's compute is known."""
    if as_json:
        emit_json(report.rows)
        return
    if report.step:
        print_step_cost(report)
        return
    if report.strategy in ("pp", "tp"):
        print_parallel_cost(report)
        return
    payload = report.rows[0]["payload_bytes"]
    what = f"a {report.strategy} step" if report.strategy else report.collective
    how = ", as gloo runs it (its reduce-scatter is an all-reduce)" if report.backend == "gloo" else ""
    table = Table(title=f"{what} of {report.params:g} {report.dtype} params ({payload / 1e9:.3g} GB) "
                        f"over {report.ranks} ranks, at {report.efficiency:.0%} of each link{how}", title_justify="left")
    per_node = report.strategy is not None and report.nproc_per_node > 1
    columns = ["link", "rate", "bytes/rank"] + (["bytes/node"] if per_node else [])
    columns += ["time/step" if report.strategy else "time/sync"] + (["state/rank"] if report.strategy else [])
    columns += ["comm/compute", "step (no overlap)"] if report.compute_s else []
    for column in columns:
        table.add_column(column, justify="right" if column != "link" else "left")
    for row in report.rows:
        cells = link_cells(row)
        cells += [f"{row['bytes_per_node_per_step'] / 1e9:.3g} GB"] if per_node else []
        cells.append(seconds_text(row["comm_s"]))
        if report.strategy:
            cells.append(f"{row['state_bytes_per_rank'] / 1e9:.3g} GB")
        if report.compute_s:
            cells += [f"{row['comm_over_compute']:.3g}", seconds_text(row["step_s_no_overlap"])]
        table.add_row(*cells)
    console.print(table)
    for note in report.notes:
        info(note)
    if report.compute_s and report.grad_accum == 1:
        info("with --grad-accum K the same sync is paid once per K micro-steps: comm/compute falls K-fold")


def link_cells(row: dict) -> list[str]:
    """A cost row's link, its rate and the bytes through a rank's NIC, as the tables show them."""
    gbit = row["rate_bps"] / 1e9
    return [row["link"], f"{gbit:.4g} Gbit/s" if gbit < 1000 else f"{gbit:.0f} Gbit/s",
            f"{row['bytes_per_rank'] / 1e9:.3g} GB"]


def print_parallel_cost(report) -> None:
    """`cost --strategy pp|tp`: a step of the pipeline or of the shared layers on each link."""
    first = report.rows[0]
    pp = report.strategy == "pp"
    how = (f"{report.ranks} stages, {first['micro_batches']} micro-batches" if pp else
           f"{first['tp_ranks']} ranks a node sharing each layer, {first['micro_batches']} micro-batches")
    table = Table(title=f"a {report.strategy} step of {report.params:g} {report.dtype} params: {how}, activations of "
                        f"{first['activation_bytes'] / 1e6:.3g} MB a micro-batch, at {report.efficiency:.0%} of each link",
                  title_justify="left")
    columns = ["link", "rate", "bytes/rank", "comm/step"] + (["bubble"] if pp else []) + ["state/rank"]
    for column in columns + (["comm/compute", "step"] if report.compute_s else []):
        table.add_column(column, justify="right" if column != "link" else "left")
    for row in report.rows:
        cells = [*link_cells(row), seconds_text(row["comm_s"])] + ([f"{row['bubble']:.0%}"] if pp else [])
        cells.append(f"{row['state_bytes_per_rank'] / 1e9:.3g} GB")
        if report.compute_s:
            cells += [f"{row['comm_over_compute']:.3g}", seconds_text(row["step_s"])]
        table.add_row(*cells)
    console.print(table)
    info("pp: step = (micro-batches + stages - 1) x (compute / stages + 2 transfers); bubble = (stages - 1) / "
         "(micro-batches + stages - 1)" if pp else "tp: 4 all-reduces of the activations a block and micro-batch, "
         "on the link inside a node; between nodes each rank's share of the gradients is DDP's (--strategy ddp, "
         "--params divided by --nproc-per-node)")
    for note in report.notes:
        info(note)


def print_step_cost(report) -> None:
    """`cost --step`: the predicted step on each link, and its terms."""
    first = report.rows[0]
    what = f"{report.strategy or 'ddp'} step" + (f" of {report.grad_accum} micro-steps" if report.grad_accum > 1 else "")
    whose = f"run {report.run}'s {what} (its gradients {first['payload_bytes'] / 1e9:.3g} GB)" if report.run else (
        f"a {what} of {report.params:g} {report.dtype} params ({first['payload_bytes'] / 1e9:.3g} GB)")
    links = "on its own link and at " if report.run else "at "
    table = Table(title=f"predicted: {whose} over {report.ranks} ranks, {links}{report.efficiency:.0%} of each link, "
                        f"compute {seconds_text(first['compute_s'] / report.grad_accum)} a micro-step "
                        f"({first['compute_from']})", title_justify="left")
    for column in ("link", "rate", "compute", "on the link", "exposed", "optimizer", "step (predicted)"):
        table.add_column(column, justify="right" if column != "link" else "left")
    for row in report.rows:
        gbit = row["rate_bps"] / 1e9  # three figures, none in e-notation: 6.93, 10, 3600
        table.add_row(row["link"], f"{gbit:.0f} Gbit/s" if gbit >= 100 else f"{gbit:.3g} Gbit/s", seconds_text(row["compute_s"]),
                      seconds_text(row["comm_s"]), seconds_text(row["exposed_comm_s"]), seconds_text(row["optimizer_s"]),
                      seconds_text(row["predicted_step_s"]))
    console.print(table)
    backward = "the wait for the slowest rank and what its backward" if report.run else "what backward (2/3 of the compute)"
    info(f"step = compute + exposed + optimizer; exposed: {backward} does not hide of "
         f"the {first['buckets']} buckets' all-reduce" + (" and the strategy's collectives outside it"
                                                         if report.strategy not in (None, "ddp") else ""))
    for note in report.notes:
        info(note)


def print_predict(result, as_json: bool) -> None:
    """`bench predict`: a row per run, then the error's median and 90th percentile."""
    if as_json:
        emit_json({**result.stats, "rows": [r.as_dict() for r in result.rows]})
        return
    table = Table(title=result.title, title_justify="left")
    for column in ("case", "world", "predicted (ms)", "measured (ms)", "error"):
        table.add_column(column, justify="left" if column == "case" else "right")
    for r in result.rows:
        table.add_row(escape(r.case), str(r.world_size), f"{r.predicted_step_ms:.1f}", f"{r.measured_step_ms:.1f}",
                      error_text(r))
    console.print(table)
    info(stats_line(result.stats))


def print_up_timings(results, repeats: int, as_json: bool) -> None:
    """`bench up`: each lab size's medians and their ratio."""
    if as_json:
        emit_json([r.as_dict() for r in results])
        return
    table = Table(title=f"labctl up vs docker compose up -d (median of {repeats})", title_justify="left")
    packages = any(r.packages_s is not None for r in results)
    columns = ("nodes", "labctl up (s)", "compose up -d (s)", "ratio")
    for column in columns + (("with packages (s)", "added (s)", "first with packages (s)") if packages else ()):
        table.add_column(column, justify="right")
    for r in results:
        cells = [str(r.nodes), f"{r.labctl_s:.2f}", f"{r.compose_s:.2f}", f"{r.ratio:.2f}"]
        if packages:
            cells += [f"{r.packages_s:.2f}", f"{r.packages_added_s:+.2f}", f"{r.first_packages_s:.2f}"]
        table.add_row(*cells)
    console.print(table)


def print_allreduce(report, as_json: bool, to_stderr: bool = False) -> None:
    """`bench allreduce` and `bench collectives`: one row per op and message size, nccl-tests' columns
    and the models' beside them (on stderr when the plot went to stdout)."""
    if as_json:
        emit_json([r.as_dict() for r in report.rows])
        return
    table = Table(title=report.title, title_justify="left")
    ops = len({r.op for r in report.rows}) > 1 or any(r.op != "all_reduce" for r in report.rows)
    for column in (("op",) if ops else ()) + ("size(B)", "count", "type", "time(us)", "algbw(GB/s)", "busbw(GB/s)",
                                              "model(us)", "meas/model", "calibrated(us)", "meas/cal", "busbw/wire"):
        table.add_column(column, justify="left" if column == "op" else "right")

    def num(value, fmt):
        return "-" if value is None else format(value, fmt)

    for r in report.rows:
        table.add_row(*((r.op,) if ops else ()), str(r.size), str(r.count), r.type, f"{r.time_us:.1f}", f"{r.algbw_gbs:.4f}", f"{r.busbw_gbs:.4f}",
                      num(r.model_us, ".1f"), num(r.meas_over_model, ".2f"), num(r.calibrated_us, ".1f"),
                      num(r.meas_over_calibrated, ".2f"), num(r.busbw_over_wire, ".2f"))
    (err_console if to_stderr else console).print(table)


def print_scaling(report, as_json: bool) -> None:
    """`bench scaling`: the table as Markdown (as scaling.md holds it), or its rows as JSON."""
    from rich.markdown import Markdown

    if as_json:
        emit_json({"rows": [r.as_dict() for r in report.rows], "notes": list(report.notes)})
        return
    console.print(Markdown(markdown(report.rows, report.title, report.notes)))


def print_straggler(result, as_json: bool) -> None:
    """`bench straggler`: the even and the balanced split side by side, and the speed-up."""
    if as_json:
        emit_json(result.as_dict())
        return
    table = Table(title=f"{result.node} at {result.cpus:g} CPUs, global batch {result.global_batch}, "
                        f"{result.steps} steps, median of {result.repeats}", title_justify="left")
    for column in ("split", "micro-batches", "tokens/s", "step ms", "slowest", "slowest/median compute",
                   "others waited (s)", "final loss"):
        table.add_column(column, justify="right")
    rows = [("even", result.even), (f"--rank-micro-batch {result.rank_micro_batch}", result.balanced)]
    piped = result.pipeline
    if piped:
        rows += [(f"pp, stages {piped[split]['stage_layers']}", piped[split]) for split in ("pp-even", "pp-auto")]
    for label, r in rows:
        table.add_row(escape(label), str(r["micro_batches"]), f"{r['tokens_per_s']:,.0f}", f"{r['step_ms']:.1f}",
                      str(r["slowest_node"]), f"{r['slowest_compute_ratio']:.2f}", f"{r['waited_for_slowest_s']:.2f}",
                      f"{r['final_loss']:.4f}")
    console.print(table)
    console.print(f"balanced / even tokens/s: [bold]{result.speedup:.2f}x[/bold]"
                  + (f"; pp on stages by speed / even: [bold]{piped['speedup_auto_vs_even']:.2f}x[/bold] "
                     f"({piped['layers']} blocks, {piped['micro_batches']} micro-batches a step, 1F1B)" if piped else ""),
                  markup=True)
    for pictures, path, note in (("before and after", result.timeline, result.timeline_note),
                                 ("of the pipelines", piped and piped["timeline"], piped and piped.get("timeline_note"))):
        if path:
            console.print(f"timelines, {pictures}: {path}", markup=False)
        elif note:
            info(escape(note))


def print_start(report, as_json: bool) -> None:
    """`bench start`: each way's median and its ratio to the warm path's, every round's seconds beside."""
    if as_json:
        emit_json(report.as_dict())
        return
    table = Table(title=f"a run's start and end on {report.nodes} nodes: median of {report.rounds} rounds, alternated",
                  title_justify="left")
    for column, justify in (("way", "left"), ("median (s)", "right"), ("vs warm", "right"), ("rounds (s)", "left")):
        table.add_column(column, justify=justify)
    for timing in report.timings:
        table.add_row(timing.way, f"{timing.median_s:.2f}", f"{timing.median_s / report.warm_s:.2f}",
                      " ".join(f"{s:.2f}" for s in timing.seconds))
    console.print(table)
