"""Everything the CLI prints: tables, panels and JSON, in one place. Each function takes the data an
API call returned and prints it; none asks anything of the lab."""

from __future__ import annotations

import json

import click
from rich.markup import escape
from rich.table import Table

from labctl.core.ui import console, err_console, error, info
from labctl.diagnose.gpus import gpu_text
from labctl.lab.compose import render_compose
from labctl.lab.listing import age_text, shaping_text
from labctl.net.apply import helper_script
from labctl.net.tc import describe_link


def emit_json(value) -> None:
    click.echo(json.dumps(value))


def print_build_hash(tag: str, inputs, existing: str | None, as_json: bool) -> None:
    """`build --print-hash`: the hash alone on stdout (for a cache key), or the whole picture as JSON."""
    if not as_json:
        click.echo(inputs.digest)
        return
    emit_json({"tag": tag, "hash": inputs.digest, "image_hash": existing, "up_to_date": existing == inputs.digest,
               "base": inputs.base, "context": str(inputs.context), "runtime": inputs.runtime_tag})


def seconds_text(value: float) -> str:
    return f"{value:.3g} s" if value >= 1 else f"{value * 1e3:.3g} ms"


# ------------------------------------------------------------------------------------ nodes, links


def nodes_table(lab: str, nodes, title: str | None = None, links: dict | None = None) -> Table:
    table = Table(title=title or f"lab {lab}", title_justify="left")
    gpus = any(n.gpus for n in nodes)  # a GPU column in a lab with GPUs only
    packages = any(n.packages for n in nodes)  # and a packages column in a lab with packages
    columns = ("node", "IP", "torch", "state") + (("GPU",) if gpus else ()) + (("packages",) if packages else ())
    for column in columns + (("link",) if links else ()):
        table.add_column(column)
    names = {n.ip: n.name for n in nodes}  # links to groups of nodes name them
    for node in nodes:
        colour = "green" if node.state == "running" else "red"
        cells = [node.name, node.ip, node.torch, f"[{colour}]{node.state}[/{colour}]"] + ([node.gpus or "-"] if gpus else [])
        cells += [node.packages or "-"] if packages else []
        if links:
            cells.append(describe_link(links[node.name], names) if node.name in links else "-")
        table.add_row(*cells)
    return table


def status_json(lab: str, nodes, links: dict | None = None, calibrated: dict | None = None, overlay=None) -> dict:
    rows, names = [], {n.ip: n.name for n in nodes}
    for n in nodes:
        row = {"name": n.name, "ip": n.ip, "torch": n.torch, "state": n.state, "packages": n.packages or None}
        if overlay is not None:
            row["overlay_ip"] = overlay.addresses.get(n.name)
        if n.gpus:
            row["gpus"] = [int(i) for i in n.gpus.split(",")]
        if links is not None and n.name in links:
            row["link"] = describe_link(links[n.name], names)
            if links[n.name].routes:
                row["links_to"] = [route_json(route, names) for route in links[n.name].routes]
        rows.append(row)
    overlay_json = None if overlay is None else {k: v for k, v in overlay.as_dict().items() if k != "addresses"}
    return {"lab": lab, "nodes": rows, "links_calibrated": calibrated, "overlay": overlay_json}


def print_nodes(lab: str, nodes, links: dict | None, as_json: bool, title: str | None = None,
                calibrated: dict | None = None, overlay=None) -> None:
    """The nodes' table (or `status --json`), the lab's overlay, and when a run last calibrated the
    lab's links."""
    if as_json:
        emit_json(status_json(lab, nodes, links, calibrated, overlay))
        return
    console.print(nodes_table(lab, nodes, title, links))
    if overlay is not None:
        info(f"overlay {overlay.kind}: {overlay.iface}, MTU {overlay.mtu}; "
             + ", ".join(f"{node} {ip or '(no tunnel)'}" for node, ip in overlay.addresses.items()))
    if calibrated:
        states = f"; {calibrated['states']} states of the links kept" if calibrated["states"] > 1 else ""
        at = str(calibrated["at"]).replace("T", " ")[:19]
        info(f"links last calibrated at {at} by run {calibrated['run']} ({len(calibrated['hosts'])} "
             f"ranks, {calibrated['backend']}, {calibrated['probes']} probes of a 1 KiB all-reduce, median "
             f"{calibrated['probe_us'] / 1e3:.2f} ms{states}); a run on another state calibrates it first")


def print_up_plan(plan, directory) -> None:
    """`up --dry-run`: each node's GPUs and image (in a lab with CUDA nodes), the Compose file and env files
    that would be written."""
    if plan.gpus.cuda_nodes:  # which node has which GPUs, and runs which image, before the files that say it
        console.print("\n".join(f"# {line}" for line in plan.gpus.describe()), markup=False)
    if plan.tcp_note:
        console.print(f"# {plan.tcp_note}", markup=False, soft_wrap=True)
    console.print(render_compose(plan.document), markup=False)
    for name, text in plan.env_files.items():
        console.print(f"# --- {directory / name}\n{text}", markup=False)
    for name, text in plan.files.items():  # slurm.conf: the munge key beside it is made on the real `up`, never printed
        console.print(f"# --- {directory / name}\n{text}", markup=False)


def links_table(links: dict, title: str, names: dict | None = None) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("node")
    table.add_column("link (read back from the kernel)")
    for node, state in links.items():
        table.add_row(node, describe_link(state, names))
    return table


def _values(state) -> dict:
    return {"rate_bps": state.rate_bps, "delay_us": state.delay_us, "jitter_us": state.jitter_us,
            "loss_pct": state.loss_pct}


def route_json(route, names: dict | None = None) -> dict:
    """A link to some nodes: their names (where known) and addresses, and what it applies."""
    return {"nodes": [(names or {}).get(d, d) for d in route.dsts], "ips": list(route.dsts), **_values(route.state)}


def link_json(node: str, state, names: dict | None = None) -> dict:
    inbound = state.inbound
    return {"node": node, "shaping": describe_link(state, names), **_values(state), "ingress": state.ingress,
            "ingress_shaping": None if inbound is None else _values(inbound),
            "links_to": [route_json(route, names) for route in state.routes]}


def print_links(lab: str, links: dict, as_json: bool = False, until: str | None = None, names: dict | None = None) -> None:
    """Each node's link as read back; `names` (address -> node) names the nodes of links to groups."""
    if as_json:
        emit_json([link_json(node, state, names) for node, state in links.items()])
    else:
        console.print(links_table(links, f"lab {lab}: links" + (f" (for {until}, then unshaped)" if until else ""), names))


def print_tc_plan(plans: dict) -> None:
    """`shape --dry-run`: the script each node's helper container would run (node -> tc.ShapePlan),
    and the one a helper left running would run after --duration."""
    for node, plan in plans.items():
        click.echo(f"# {node} (helper container in its network namespace, NET_ADMIN)")
        click.echo(helper_script(plan.commands), nl=False)
        if plan.undo:
            click.echo(f"# {node}: undo after {plan.duration_s}s (a helper container left running; `labctl down`, "
                       "or a later shape or --clear of the node, removes it)")
            click.echo(helper_script(plan.undo), nl=False)


def print_host_commands(commands: list[tuple[str, str]]) -> None:
    for name, command in commands:
        console.print(f"[bold]{name}[/bold]: {command}", markup=True, soft_wrap=True)


def print_sync(hosts, result) -> None:
    """`hosts sync`: what each host received, and how to run the job there by hand."""
    for host in hosts.inventory.hosts:
        s = result.stats[host.name]
        info(f"{host.name} ({host.destination}): {s['files']} files changed, {s['bytes_sent'] / 1e3:,.1f} kB sent "
             f"to {host.workspace}")
    info(f"synced {len(hosts.inventory.hosts)} hosts in {result.seconds:.1f} s; to run by hand on each:")
    print_host_commands(result.manual_commands)


# ---------------------------------------------------------------------------------------- runs


def print_launches(plan, address) -> None:
    """A run plan, as `--dry-run` shows it: which launcher and why, then what each process would run,
    and where."""
    if plan.launcher:
        console.print(f"# launcher: {plan.launcher} ({plan.why})", markup=False, soft_wrap=True)
    if plan.packages:
        console.print(f"# packages: {plan.packages}", markup=False, soft_wrap=True)
    for launch in plan.launches:
        console.print(f"[bold]{launch.label}[/bold] ({address(launch.node)}): {launch.display()}", markup=True,
                      soft_wrap=True)


def print_logs(logs: list[tuple[str, str]]) -> None:
    """(node, text) pairs, each under a header naming the node when there are several, as `tail`
    prints several files (one is printed bare, as `tail` prints one)."""
    for name, text in logs:
        if len(logs) > 1:
            click.echo(f"==> {name} <==")
        click.echo(text, nl=False)


def print_log_stream(chunks, headers: bool = True) -> None:
    """`logs -f`: (node, lines) as they come; with `headers` (several nodes), under a header naming the
    node whenever it changes, as `tail -f` does with several files. Each write flushed, so a pipe sees
    it at once."""
    last = None
    for node, text in chunks:
        if headers and node != last:
            click.echo(f"==> {node} <==")
            last = node
        click.echo(text, nl=False)


# ------------------------------------------------------------------------------------ labs


def print_down(lab: str, removed: dict[str, int], left: dict[str, list[str]]) -> None:
    """`down`: what it removed, and by name what the engine still has of the lab (the kept volume)."""
    parts = [f"{count} {kind[:-1] if count == 1 else kind}" for kind, count in removed.items()
             if count or kind != "volumes"]
    message = f"lab {lab}: removed {', '.join(parts)}"
    kept = left.get("volumes", [])
    if kept:
        message += (f"; kept volume{'s' * (len(kept) > 1)} {', '.join(kept)} (/shared on the nodes, for the next "
                    f"`up`; `labctl down --lab {lab} --volumes` removes it)")
    remaining = left.get("containers", []) + left.get("networks", [])
    if remaining:  # made meanwhile, by an `up` of the same lab running at the same time
        message += f"; still there: {', '.join(remaining)} (`labctl down --lab {lab}` again removes them)"
    info(message)


def labs_table(labs, now: float) -> Table:
    table = Table(title="labs on this engine", title_justify="left")
    for column in ("lab", "nodes", "shaping", "age", "workspace", "user"):
        table.add_column(column)
    for lab in labs:
        colour = "green" if lab.total and lab.running == lab.total else "yellow" if lab.running else "red"
        table.add_row(escape(lab.name), f"[{colour}]{lab.running}/{lab.total}[/{colour}]", escape(shaping_text(lab.shaping)),
                      age_text(now - lab.created) if lab.created is not None else "-", escape(lab.workspace or "?"),
                      escape(lab.user or "-"))
    return table


def print_labs(labs, as_json: bool, now: float) -> None:
    """`ls`: one row per lab; then, for a lab with no nodes, what is left of it and how it goes."""
    if as_json:
        emit_json([lab.as_dict(now) for lab in labs])
        return
    if not labs:
        info("no labs on this engine (`labctl up` brings one up)")
        return
    console.print(labs_table(labs, now))
    empty = [lab for lab in labs if not lab.total]
    if empty:
        info(f"no nodes, only {'a volume or network' if len(empty) == 1 else 'volumes or networks'} left: "
             f"{', '.join(lab.name for lab in empty)} (`labctl down --lab NAME --volumes` removes what a lab left)")


def print_gc(verdicts, images, dry_run: bool, as_json: bool) -> None:
    """`gc`: each lab removed (or that would be) and why, the labs kept and why, dimmed; then each
    package image removed (or that would be). With --json the labs' verdicts go to stdout, the images
    to stderr as ever."""
    verb = "would remove" if dry_run else "removed"
    if as_json:
        emit_json([v.as_dict() for v in verdicts])
    else:
        for v in verdicts:
            if v.remove:
                info(f"{verb} lab {v.lab}: {escape(v.why)}")
            else:
                info(f"[dim]kept lab {v.lab}: {escape(v.why)}[/dim]")
    for image in (i for i in images if i.remove):
        info(f"{verb} package image {image.image}: {escape(image.why)}")
    if not as_json and not any(v.remove for v in [*verdicts, *images]):
        info("nothing to remove" + ("" if verdicts else ": no labs on this engine"))


# -------------------------------------------------------------------------------------- doctor


def print_findings(diagnosis, problems_only: bool = False, out=None) -> None:
    """doctor's report: the nodes' facts, then one line per finding (or only the problems), then
    the verdict; on stdout, or `out`."""
    out = out or console
    findings = diagnosis.problems if problems_only else diagnosis.findings
    if diagnosis.nodes and not problems_only:
        out.print(_facts_table(diagnosis.title, diagnosis.nodes))
    for f in findings:
        mark = "[green]ok[/green]  " if f.ok else "[yellow]WARN[/yellow]" if f.warn else "[bold red]FAIL[/bold red]"
        where = "" if f.node == "all" else f"{f.node}: "
        out.print(f"{mark} {f.check:<10} {where}{escape(f.message)}", markup=True, soft_wrap=True)
        if f.fix and not f.ok:
            out.print(f"     [yellow]fix:[/yellow] {escape(f.fix)}", markup=True, soft_wrap=True)
    bad = sum(f.blocking for f in findings)
    warnings = sum(f.warn and not f.ok for f in findings)
    verdict = "[green]no problems found[/green]" if not bad else f"[bold red]{bad} problem{'s' * (bad != 1)}[/bold red]"
    if warnings:
        verdict += f", [yellow]{warnings} warning{'s' * (warnings != 1)}[/yellow]"
    out.print(f"{verdict} in {diagnosis.seconds:.1f} s", markup=True)


def _facts_table(title: str, nodes: dict) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("node", "ip", "torch", "python", "cuda", "nccl", "driver", "gpus", "socket iface"):
        table.add_column(column)
    for node, i in nodes.items():
        iface = i.get("iface") or "-"
        addrs = ", ".join(i.get("ifaces", {}).get(iface, [])) or "missing"
        table.add_row(node, i.get("ip", "-"), str(i.get("torch")), str(i.get("python")), str(i.get("cuda") or "-"),
                      str(i.get("nccl") or "-"), str(i.get("driver") or "-"), gpu_text(i.get("gpus") or []),
                      f"{iface} ({addrs})")
    return table


def report_check(diagnosis, as_json: bool) -> bool:
    """doctor's report (a table, or JSON); whether nothing is wrong (the exit status follows)."""
    if as_json:
        emit_json(diagnosis.as_dict())
    else:
        print_findings(diagnosis)
    return diagnosis.ok


def print_preflight(diagnosis, full_check: str) -> None:
    """A preflight's verdict: show what is not right (on stderr: stdout is the run's, or its JSON);
    refuse to start on a problem (warnings pass)."""
    if diagnosis.problems:
        print_findings(diagnosis, problems_only=True, out=err_console)
    diagnosis.raise_for_problems(full_check)


def print_cleared_caches(folders: dict[str, str]) -> None:
    """Which compile caches `run --fresh-compile-cache` emptied, a line per folder (stderr)."""
    by_folder: dict[str, list[str]] = {}
    for node, folder in folders.items():
        by_folder.setdefault(folder, []).append(node)
    for folder, nodes in by_folder.items():
        info(f"{', '.join(nodes)}: compile cache {folder} emptied" if folder
             else f"{', '.join(nodes)}: no compile cache (TORCHINDUCTOR_CACHE_DIR not set)")


def finish_run(result, as_json: bool, extra: dict | None = None) -> None:
    """After `run`/`hosts run`: with --json, the run as one document on stdout (and `extra`'s keys:
    run --trace's "trace"), and its exit status."""
    if as_json:
        emit_json({**result.to_dict(), **(extra or {})})
        if not result.ok:  # the last lines for people, on stderr, as without --json

            error(f"run failed: {result.explain()}")
        if result.exit_status:
            raise SystemExit(result.exit_status)


# ----------------------------------------------------------------------------------- scenarios


def scenarios_table(scenarios) -> Table:
    table = Table(title="labctl scenario run NAME", title_justify="left", show_lines=True)
    for column in ("name", "trap", "network", "bound", "what it teaches"):
        table.add_column(column)
    for s in scenarios:
        network = s.overlays[0] + (f" (or {', '.join(s.overlays[1:])})" if len(s.overlays) > 1 else "")
        table.add_row(s.name, s.title, network, f"{s.bound_s} s", s.lesson)
    return table


def print_scenario(outcome, title: str) -> None:
    from rich.panel import Panel

    verdict = "[green]succeeded[/green]" if outcome.fixed_ok else "[bold red]still failing[/bold red]"
    symptom = outcome.symptom or "(none: nothing torch printed says anything is wrong)"
    body = "\n".join([
        f"[bold]symptom[/bold] (as torch prints it): {escape(symptom)}",
        f"[bold]time to show[/bold]: {outcome.seconds_to_show:.1f} s (exit {outcome.broken_exit})",
        "[bold]doctor[/bold] ({:.1f} s): {}".format(outcome.doctor_seconds, escape(
            "; ".join(outcome.doctor) or "(nothing found)")),
        *([f"[bold]timeline[/bold] (labctl trace): {escape(outcome.timeline)}"] if outcome.timeline else []),
        f"[bold]fix[/bold]: {escape(outcome.fix)}",
        f"[bold]after the fix[/bold]: {verdict}, run took {outcome.fixed_seconds:.1f} s; "
        f"scenario {outcome.total_seconds:.0f} s of its {outcome.bound_s} s bound: "
        + ("[green]OK[/green]" if outcome.ok else "[bold red]FAILED[/bold red] (no symptom, no fix, or over the bound)"),
    ])
    network = f" (on {outcome.overlay})" if outcome.overlay != "none" else ""
    console.print(Panel(body, title=f"{outcome.name}: {title}{network}", title_align="left"), markup=True)


def print_pod_run(pods, address) -> None:
    """`k8s run`: what the lab takes from the manifest and what it cannot honour, on stderr before the
    run; with `address` (--dry-run), on stdout as comments, then each node's command."""
    if address is None:
        for line in pods.lines:
            info(escape(line))
        return
    for line in pods.lines:
        console.print(f"# {line}", markup=False, soft_wrap=True)
    print_launches(pods.plan, address)
