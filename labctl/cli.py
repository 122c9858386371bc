"""labctl: bring up an N-node PyTorch DDP lab in Docker, run the same trainer on every node, tear it down.

The CLI parses, resolves the configuration once, and delegates: builders in config/envfiles/
compose/launch, appliers in lab/image/runner. Only this module exits the process.
"""

from __future__ import annotations

import atexit
import gc
import json
import logging
import os
import sys
import time
from pathlib import Path

import click

from labctl import __version__
from labctl.config import AUTO, LabConfig, load_config
from labctl.errors import CommandError, LabError, RunFailed

SUBNET_ATTEMPTS = 4  # `up` picks again when a concurrent `up` took the same free subnet
CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class LabGroup(click.Group):
    """Turns the project's errors into one clear message and an exit status; never a traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except LabError as exc:
            _fail(f"error: {exc.message}", exc.hint, exc.exit_code)
        except CommandError as exc:
            _fail(f"error: {exc}", None, exc.exit_code)
        except RunFailed as exc:
            _fail(f"run failed: {exc}", None, exc.exit_code)
        except KeyboardInterrupt:
            _fail("interrupted", None, 130)


def _fail(message: str, hint: str | None, code: int):
    from labctl.ui import err_console

    from rich.markup import escape

    # Messages quote torch and gloo, whose [file:line] tags rich would read as markup.
    err_console.print(f"[bold red]{escape(message)}[/bold red]", markup=True, soft_wrap=True)
    if hint:
        err_console.print(f"  [yellow]hint:[/yellow] {escape(hint)}", markup=True, soft_wrap=True)
    sys.exit(code)


def _workspace() -> Path:
    return Path.cwd().resolve()


def _config(**flags) -> LabConfig:
    given = {key: value for key, value in flags.items() if value is not None}
    return load_config(_workspace(), os.environ, given)


def lab_option(f):
    return click.option("--lab", metavar="NAME", help="Lab name [env DDPLAB_LAB; default ddplab].")(f)


def run_options(f):
    """What `labctl run` and `labctl hosts run` both take: the launcher and the two timeouts."""
    f = click.option("--pg-timeout-s", type=click.FloatRange(1, 3600), default=30.0, show_default=True, metavar="S",
                     help="Process-group timeout for the trainer (DDPLAB_PG_TIMEOUT_S): a dead peer fails "
                          "collectives after S.")(f)
    f = click.option("--timeout-s", type=float, default=None, metavar="S",
                     help="Stop the run everywhere after S seconds (default: no limit).")(f)
    return click.option("--launcher", type=click.Choice(["torchrun", "static"]), default="torchrun",
                        show_default=True, help="torchrun (c10d rendezvous) or static (RANK/WORLD_SIZE/MASTER_ADDR "
                                                "exported, plain python).")(f)


@click.group(cls=LabGroup, context_settings=CONTEXT)
@click.version_option(__version__, prog_name="labctl")
@click.option("-v", "--verbose", is_flag=True, help="Log every external command labctl runs.")
def main(verbose: bool) -> None:
    """A multi-node PyTorch DDP lab on one machine: N containers, one trainer, real torch.distributed.

    \b
    Typical session:
      labctl up --nodes 3          # build the image if needed, start node0..node2
      labctl run -- -m trainer     # torchrun on every node, output prefixed per node
      labctl status                # what Docker says each node is doing
      labctl down                  # remove every container and network of the lab
    """
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING, format="labctl: %(message)s")
    # At exit, spare the interpreter's last garbage collection of everything imported (40-50 ms of
    # freeing memory that the OS takes back anyway); atexit handlers and flushing still run.
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)


# ----------------------------------------------------------------------------------------- build


@main.command(context_settings=CONTEXT)
@click.option("--torch-version", metavar="X.Y.Z", help="torch release to pin [env DDPLAB_TORCH_VERSION; default 2.13.0].")
@click.option("--base-image", metavar="IMAGE", help="Base image [env DDPLAB_BASE_IMAGE; default python:3.11-slim-bookworm].")
@click.option("--image", metavar="TAG", help="Tag of the node image [env DDPLAB_IMAGE; default ddplab-node:torch<VERSION>-cpu].")
@click.option("--force", is_flag=True, help="Build even if an image with the same inputs exists.")
@click.option("--verbose", "verbose_build", is_flag=True, help="Print every line of the build's output.")
@click.option("--mismatch-image", is_flag=True,
              help="Also build the image with another torch release that `scenario run version-mismatch` puts on one node.")
def build(torch_version, base_image, image, force, verbose_build, mismatch_image) -> None:
    """Build the node image (torch CPU build, iproute2, iperf3, the trainer).

    Works without a registry: when the base image cannot be pulled, a local Debian base is built
    with debootstrap, and Python packages come from a wheelhouse the host fills with pip.
    """
    from labctl import image as image_mod
    from labctl.lab import docker_client
    from labctl.ui import BuildProgress, info

    config = _config(torch_version=torch_version, base_image=base_image, image=image)
    client = docker_client()
    started = time.monotonic()
    result = image_mod.build_image(client, config, info, lambda: BuildProgress(verbose_build), force=force)
    state = "up to date" if result.cached else "built"
    info(f"image {result.tag} {state} (base {result.base}, torch {config.torch_version}) in {time.monotonic() - started:.1f} s")
    if mismatch_image:
        started = time.monotonic()
        tag = image_mod.ensure_mismatch_image(client, config, info)
        info(f"image {tag} ready in {time.monotonic() - started:.1f} s (torch {image_mod.MISMATCH_VERSION}, "
             "for the version-mismatch scenario)")


# -------------------------------------------------------------------------------------------- up


@main.command(context_settings=CONTEXT)
@lab_option
@click.option("--nodes", metavar="N", help="Number of nodes, 1-64 [env DDPLAB_NODES; default 3; a running lab keeps its count].")
@click.option("--nproc-per-node", metavar="P", help="Processes per node for torchrun [env DDPLAB_NPROC_PER_NODE; default 1].")
@click.option("--cpus", metavar="C", help="CPU limit per node, e.g. 0.5 [env DDPLAB_CPUS; default none].")
@click.option("--memory", metavar="SIZE", help="Memory limit per node, e.g. 2g [env DDPLAB_MEMORY; default 4g].")
@click.option("--subnet", metavar="CIDR", help="Lab network, e.g. 172.28.5.0/24, or auto [env DDPLAB_SUBNET; default auto].")
@click.option("--master-port", metavar="PORT", help="Rendezvous port on node0, 1024-65535 [env DDPLAB_MASTER_PORT; default 29500].")
@click.option("--image", metavar="TAG", help="Node image [env DDPLAB_IMAGE].")
@click.option("--bw", metavar="RATE", help="Shape every node's link at bring-up, e.g. 1gbit (as `labctl shape --bw`).")
@click.option("--node-cpus", metavar="NODE=C,...", help="Per-node CPU limits over --cpus, e.g. node2=0.25 (a straggler).")
@click.option("--ssh/--no-ssh", default=None,
              help="Make every node an SSH host and write .lab/<lab>/hosts.toml for `labctl hosts` "
                   "[default: as the running lab is; off for a new one].")
@click.option("--dry-run", is_flag=True, help="Print the Compose file and env files that would be used; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the node table as JSON (as `status --json`).")
def up(lab, nodes, nproc_per_node, cpus, memory, subnet, master_port, image, bw, node_cpus, ssh, dry_run,
       as_json) -> None:
    """Start (or reconcile) the lab: nodes node0..node{N-1} on their own bridge network.

    On a running lab, `up` reconciles instead of failing: `--nodes 5` on a 3-node lab adds two
    nodes (and rewrites every env file, since NNODES changed); without `--nodes` it keeps the count.

    With --ssh every node also runs sshd (as the node's own user, with a host key of its own) for a
    key pair made for the lab, and .lab/<lab>/hosts.toml describes the nodes as real hosts: their
    addresses, the user, the key and a known_hosts file, for `labctl hosts check|sync|run`.
    """
    from labctl import engine as engine_mod
    from labctl import image as image_mod
    from labctl import lab as lab_mod
    from labctl import sshnodes
    from labctl.compose import LABEL_SSH, render_compose
    from labctl.ui import BuildProgress, console, info, nodes_table

    from labctl.shaping import parse_shape

    config = _config(lab=lab, nodes=nodes, nproc_per_node=nproc_per_node, cpus=cpus, memory=memory,
                     subnet=subnet, master_port=master_port, image=image)
    wanted = parse_shape(bw) if bw is not None else None
    client = lab_mod.docker_client()
    engine = engine_mod.usable_engine(client)
    existing = lab_mod.lab_containers(client, config.lab)
    if existing and config.sources.get("nodes") == "default":
        from dataclasses import replace

        config = replace(config, nodes=len(existing))
    from labctl.config import parse_node_cpus

    # Checked against the lab's final size (a running lab keeps its count), before anything changes.
    per_node_cpus = parse_node_cpus(node_cpus, config.nodes) if node_cpus is not None else None
    if ssh is None:  # a running lab keeps what it was brought up with
        ssh = any((c.get("Labels") or {}).get(LABEL_SSH) == "true" for c in existing)
    refused = engine_mod.ssh_refusal(engine) if ssh else None
    if refused:
        raise refused
    lab_directory = lab_mod.lab_dir(_workspace(), config.lab)
    public_key = sshnodes.lab_public_key(lab_directory, config.lab, make=not dry_run) if ssh else None
    started = time.monotonic()
    document, env_files, subnet_used = lab_mod.plan_up(client, config, _workspace(), per_node_cpus, public_key, engine)
    if dry_run:
        console.print(render_compose(document), markup=False)
        for name, text in env_files.items():
            console.print(f"# --- {lab_mod.lab_dir(_workspace(), config.lab) / name}\n{text}", markup=False)
        return
    if not image_mod.image_exists(client, config.image_tag):
        info(f"image {config.image_tag} is missing: building it")
        image_mod.build_image(client, config, info, lambda: BuildProgress())
    warning = engine_mod.limits_warning(engine, config.memory, config.pids_limit)
    if warning:
        info(warning)
    verb = "reconciling" if existing else "starting"
    for attempt in range(1, SUBNET_ATTEMPTS + 1):
        info(f"{verb} lab {config.lab}: {config.nodes} nodes on {subnet_used}")
        try:
            nodes_state = lab_mod.apply_up(client, config, _workspace(), document, env_files, info, engine)
            break
        except (CommandError, LabError) as exc:
            # Another lab (or anything else) took the same free subnet between our pick and Compose
            # creating the network: the failed attempt was removed, so pick again.
            raced = "overlaps with other one" in str(exc) and config.subnet == AUTO and not existing
            if not raced or attempt == SUBNET_ATTEMPTS:
                raise
            info(f"{subnet_used} was taken meanwhile; picking another subnet")
            document, env_files, subnet_used = lab_mod.plan_up(client, config, _workspace(), per_node_cpus, public_key,
                                                               engine)
    links = None
    if wanted:
        from labctl import netshape

        names = [n.name for n in nodes_state]
        netshape.apply_shape(client, config.lab, names, wanted, config.iface)
        links = netshape.read_links(client, config.lab, names, config.iface)
    inventory = lab_directory / sshnodes.INVENTORY_FILE
    if ssh:
        inventory = sshnodes.write_ssh_files(client, config, lab_directory, nodes_state, lab_mod.engine_cpus(client))
        info(f"every node is an SSH host; {inventory} describes them: `labctl hosts check --lab {config.lab}`")
    elif inventory.is_file():  # the nodes no longer run sshd: an inventory of them would mislead
        inventory.unlink()
    if as_json:
        click.echo(json.dumps(_status_json(config.lab, nodes_state, links)))
        return
    console.print(nodes_table(config.lab, nodes_state, f"lab {config.lab} ({subnet_used}), up in {time.monotonic() - started:.1f} s",
                              links))


# ----------------------------------------------------------------------------------- status/down


def _status_json(lab: str, nodes, links: dict | None = None) -> dict:
    from labctl.shaping import describe

    rows = []
    for n in nodes:
        row = {"name": n.name, "ip": n.ip, "torch": n.torch, "state": n.state}
        if links is not None and n.name in links:
            row["link"] = describe(links[n.name])
        rows.append(row)
    return {"lab": lab, "nodes": rows}


@main.command(context_settings=CONTEXT)
@lab_option
@click.option("--json", "as_json", is_flag=True, help='Print {"lab": ..., "nodes": [{"name", "ip", "torch", "state"}]}.')
def status(lab, as_json) -> None:
    """Show each node as Docker sees it now: IP, torch version, state, and its link as the kernel
    reports it (read back with tc, not from a cache)."""
    from labctl import lab as lab_mod
    from labctl.ui import console, info, nodes_table

    from labctl import netshape

    config = _config(lab=lab)
    client = lab_mod.docker_client()
    nodes = lab_mod.lab_status(client, config.lab)
    running = [n.name for n in nodes if n.state == "running"]
    links = netshape.read_links(client, config.lab, running, config.iface) if running else {}
    if as_json:
        click.echo(json.dumps(_status_json(config.lab, nodes, links)))
        return
    if not nodes:
        info(f"lab {config.lab} is not up (`labctl up --lab {config.lab}` starts it)")
        return
    console.print(nodes_table(config.lab, nodes, links=links))


@main.command(context_settings=CONTEXT)
@lab_option
@click.option("--volumes", is_flag=True, help="Also remove the lab's shared volume (kept by default, like compose).")
@click.option("--dry-run", is_flag=True, help="List what would be removed; remove nothing.")
def down(lab, volumes, dry_run) -> None:
    """Remove every container and network of the lab. Idempotent; also cleans up a broken `up`."""
    from labctl import lab as lab_mod
    from labctl.ui import console, info

    config = _config(lab=lab)
    client = lab_mod.docker_client()
    if dry_run:
        for kind, names in lab_mod.lab_resources(client, config.lab, volumes).items():
            console.print(f"{kind}: {', '.join(names) or '-'}", markup=False)
        return
    removed = lab_mod.apply_down(client, config.lab, volumes=volumes)
    parts = [f"{count} {kind[:-1] if count == 1 else kind}" for kind, count in removed.items()
             if count or kind != "volumes"]
    info(f"lab {config.lab}: removed {', '.join(parts)}")


# ------------------------------------------------------------------------------------------- env


@main.command(context_settings=CONTEXT)
@click.option("--hosts", required=True, metavar="ADDR1,ADDR2,...", help="Addresses of the machines; the first hosts the rendezvous.")
@click.option("--iface", required=True, metavar="IFACE", help="Interface that carries those addresses, e.g. tailscale0, eth0.")
@click.option("--nproc-per-node", metavar="P", help="Processes per machine [default 1].")
@click.option("--master-port", metavar="PORT", help="Rendezvous port on the first host [default 29500].")
@click.option("--rdzv-id", default="ddplab", show_default=True, metavar="ID", help="Rendezvous id, the same on every host.")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=Path(".lab/hosts"), show_default=True,
              help="Directory for the env files.")
def env(hosts, iface, nproc_per_node, master_port, rdzv_id, out_dir) -> None:
    """Write the same per-node env files for real machines, and print the command for each."""
    from labctl.envfiles import Topology, build_env_files, check_out_dir, host_commands, parse_hosts, write_env_files
    from labctl.ui import console, info

    from labctl.config import SETTINGS
    from labctl.errors import ConfigError

    addresses = parse_hosts(hosts)
    try:
        SETTINGS["lab"][1](rdzv_id)  # the same rule as lab names: it names files and store keys
    except ValueError as exc:
        raise ConfigError("--rdzv-id", rdzv_id, str(exc)) from None
    config = _config(iface=iface, nproc_per_node=nproc_per_node, master_port=master_port)
    check_out_dir(out_dir)
    topo = Topology.uniform(addresses, iface=config.iface, nproc_per_node=config.nproc_per_node,
                            master_port=config.master_port, rdzv_id=rdzv_id)
    names = [f"node{i}" for i in range(topo.nnodes)]
    paths = write_env_files(out_dir, build_env_files(topo, names))
    info(f"wrote {len(paths)} env files to {out_dir}/ (copy each to its machine, same path)")
    for (host, command), name in zip(host_commands(topo, out_dir, names), names):
        console.print(f"[bold]{name}[/bold] ({host}):  {command}", markup=True, soft_wrap=True)
    info(f"open TCP {topo.master_port} on {addresses[0]}, and ephemeral ports between all hosts (gloo/NCCL connect back)")


# ------------------------------------------------------------------------------------------- run


@main.command(context_settings={**CONTEXT, "ignore_unknown_options": True, "allow_interspersed_args": False})
@lab_option
@click.option("--nproc-per-node", metavar="P", help="Processes per node [default: the lab's, from its env files].")
@run_options
@click.option("--dry-run", is_flag=True, help="Print the command each node would run; run nothing.")
@click.option("--no-preflight", is_flag=True, help="Skip doctor's cheap checks (env, versions, interface) before the run.")
@click.option("--max-restarts", type=click.IntRange(0, 100), default=0, show_default=True, metavar="K",
              help="torchrun restarts every worker up to K times after a failure (the trainer resumes from its checkpoint).")
@click.option("--nnodes", metavar="MIN:MAX", help="Elastic node range, MAX = the lab's nodes: the run goes on with MIN survivors.")
@click.argument("script", nargs=-1, type=click.UNPROCESSED)
def run(lab, nproc_per_node, launcher, timeout_s, dry_run, no_preflight, max_restarts, nnodes, pg_timeout_s,
        script) -> None:
    """Run TRAINING_SCRIPT [ARGS...] (or `-m module [ARGS...]`) on every node at once.

    \b
    Examples:
      labctl run -- -m trainer --epochs 3
      labctl run --launcher static -- my_ddp_script.py --lr 0.1
    """
    from labctl import lab as lab_mod
    from labctl import runner
    from labctl.launch import Elastic, build_launches, parse_nnodes, parse_script_args

    config = _config(lab=lab)
    nproc = _nproc_flag(nproc_per_node)
    _check_timeout(timeout_s)
    script_args = parse_script_args(list(script))
    client = lab_mod.docker_client()
    nodes = lab_mod.require_running(client, config.lab)
    lab_directory = lab_mod.lab_dir(_workspace(), config.lab)
    node_env = runner.read_node_envs(lab_directory, [n.name for n in nodes])
    run_id, run_dir = runner.new_run(lab_directory)
    low, high = parse_nnodes(nnodes, len(nodes)) if nnodes else (None, None)
    elastic = Elastic(max_restarts, low, high)
    launches = build_launches(node_env, script_args, launcher=launcher, nproc_per_node=nproc,
                              run_id=run_id, run_dir=run_dir, cpus=lab_mod.engine_cpus(client), elastic=elastic,
                              pg_timeout_s=pg_timeout_s)
    docker_nodes = lab_mod.DockerNodes(client, config.lab)
    if dry_run:
        _print_launches(docker_nodes, launches)
        return
    if not no_preflight:
        _preflight(client, config.lab, nodes)
    runner.run_job(docker_nodes, node_env, launches, run_dir, run_id, torchrun=launcher == "torchrun",
                   timeout_s=timeout_s, min_nodes=low)


def _nproc_flag(value: str | None) -> int | None:
    """--nproc-per-node, checked by the same rule as DDPLAB_NPROC_PER_NODE; None when not given."""
    from labctl.config import SETTINGS
    from labctl.errors import ConfigError

    if value is None:
        return None
    try:
        return SETTINGS["nproc_per_node"][1](value)
    except ValueError as exc:
        raise ConfigError("--nproc-per-node", value, str(exc)) from None


def _check_timeout(timeout_s: float | None) -> None:
    from labctl.errors import ConfigError

    if timeout_s is not None and timeout_s <= 0:
        raise ConfigError("--timeout-s", timeout_s, "must be a positive number of seconds")


def _print_launches(nodes, launches) -> None:
    from labctl.ui import console

    for launch in launches:
        console.print(f"[bold]{launch.label}[/bold] ({nodes.address(launch.node)}): {launch.display()}", markup=True,
                      soft_wrap=True)


@main.command(context_settings=CONTEXT)
@lab_option
@click.option("--json", "as_json", is_flag=True, help='Print {"ok", "seconds", "nodes": {...}, "findings": [...]}.')
def doctor(lab, as_json) -> None:
    """Check the lab for what makes distributed runs hang, in seconds: versions, ranks, the
    rendezvous host, the socket interface, and reachability of the rendezvous and back-connect
    ports between every pair of nodes. Exit status 1 when something is wrong; each problem names
    the node and the fix."""
    from labctl import doctor as doctor_mod
    from labctl import lab as lab_mod

    config = _config(lab=lab)
    client = lab_mod.docker_client()
    nodes = lab_mod.require_running(client, config.lab)
    findings, info, seconds = doctor_mod.diagnose(client, config.lab, nodes, _lab_subnet(client, config.lab))
    _report_check(f"lab {config.lab}: nodes", findings, info, seconds, as_json)


def _report_check(title: str, findings, info: dict, seconds: float, as_json: bool) -> None:
    """doctor's report (a table, or JSON), and exit status 1 when anything is wrong."""
    ok = not any(f.blocking for f in findings)
    if as_json:
        click.echo(json.dumps({"ok": ok, "seconds": round(seconds, 2), "nodes": info,
                               "findings": [f.as_dict() for f in findings]}))
    else:
        _print_findings(title, findings, info, seconds)
    if not ok:
        sys.exit(1)


def _preflight(client, lab: str, nodes) -> None:
    """doctor's cheap checks; a failure stops the run before anything can hang."""
    from labctl import doctor as doctor_mod

    findings, _, seconds = doctor_mod.diagnose(client, lab, nodes, _lab_subnet(client, lab), cheap=True)
    _refuse_on_problems(f"lab {lab}", findings, seconds, f"labctl doctor --lab {lab}")


def _refuse_on_problems(title: str, findings, seconds: float, full_check: str) -> None:
    """A preflight's verdict: show what is not right, and refuse to start on a problem (warnings pass)."""
    from labctl.errors import LabError

    if any(not f.ok for f in findings):
        _print_findings(title, [f for f in findings if not f.ok], None, seconds)
    bad = [f for f in findings if f.blocking]
    if bad:
        raise LabError(f"preflight found {len(bad)} problem{'s' * (len(bad) != 1)}; the run was not started",
                       hint=f"`{full_check}` for the full check; --no-preflight to run anyway")


def _lab_subnet(client, lab: str) -> str | None:
    from labctl import lab as lab_mod

    subnets = [s for net in lab_mod.lab_networks(client, lab) for s in lab_mod.network_subnets(net)]
    return subnets[0] if subnets else None


def _print_findings(title: str, findings, info: dict | None, seconds: float) -> None:
    from rich.table import Table

    from labctl.ui import console

    if info:
        table = Table(title=title, title_justify="left")
        for column in ("node", "ip", "torch", "python", "cuda", "nccl", "socket iface"):
            table.add_column(column)
        for node, i in info.items():
            iface = i.get("iface") or "-"
            addrs = ", ".join(i.get("ifaces", {}).get(iface, [])) or "missing"
            table.add_row(node, i.get("ip", "-"), str(i.get("torch")), str(i.get("python")), str(i.get("cuda") or "-"),
                          str(i.get("nccl") or "-"), f"{iface} ({addrs})")
        console.print(table)
    for f in findings:
        mark = "[green]ok[/green]  " if f.ok else "[yellow]WARN[/yellow]" if f.warn else "[bold red]FAIL[/bold red]"
        where = "" if f.node == "all" else f"{f.node}: "
        console.print(f"{mark} {f.check:<10} {where}{escape_markup(f.message)}", markup=True, soft_wrap=True)
        if f.fix and not f.ok:
            console.print(f"     [yellow]fix:[/yellow] {escape_markup(f.fix)}", markup=True, soft_wrap=True)
    bad = sum(f.blocking for f in findings)
    warnings = sum(f.warn and not f.ok for f in findings)
    verdict = "[green]no problems found[/green]" if not bad else f"[bold red]{bad} problem{'s' * (bad != 1)}[/bold red]"
    if warnings:
        verdict += f", [yellow]{warnings} warning{'s' * (warnings != 1)}[/yellow]"
    console.print(f"{verdict} in {seconds:.1f} s", markup=True)


def escape_markup(text: str) -> str:
    from rich.markup import escape

    return escape(text)


# ----------------------------------------------------------------------------------------- hosts


@main.group(context_settings=CONTEXT)
def hosts() -> None:
    """The same env files, preflight and trainer on real machines, over SSH.

    \b
    The machines are listed in an inventory (TOML): address, user, SSH port, identity file, socket
    interface, processes, the Python that has torch, and the workspace folder, per host or under
    [defaults]. `labctl up --ssh` writes one for the lab's nodes at .lab/<lab>/hosts.toml.
    Host keys are checked against known_hosts: a new host needs --accept-new, a changed key is refused.

    \b
      labctl hosts check --inventory cluster.toml --accept-new   # first contact: record the host keys
      labctl hosts run --inventory cluster.toml -- -m trainer --epochs 3
    """


def inventory_option(f):
    return click.option("--inventory", metavar="FILE",
                        help="The hosts (TOML) [env DDPLAB_INVENTORY; default .lab/<lab>/hosts.toml, "
                             "as `labctl up --ssh` writes it].")(f)


def accept_new_option(f):
    return click.option("--accept-new", is_flag=True,
                        help="Record the host key of a host seen for the first time (a changed key is still refused).")(f)


def _inventory(lab: str | None, path: str | None):
    """The inventory given, or the one `labctl up --ssh` writes for the lab."""
    from labctl.inventory import load_inventory
    from labctl.lab import lab_dir
    from labctl.sshnodes import INVENTORY_FILE

    config = _config(lab=lab, inventory=path)
    return load_inventory(Path(config.inventory) if config.inventory else
                          lab_dir(_workspace(), config.lab) / INVENTORY_FILE)


def _exclude_option(f):
    return click.option("--exclude", "excludes", multiple=True, metavar="PATTERN",
                        help="Also leave PATTERN out of the sync (rsync's --exclude syntax; repeatable).")(f)


@hosts.command("check", context_settings=CONTEXT)
@lab_option
@inventory_option
@accept_new_option
@click.option("--json", "as_json", is_flag=True, help='Print {"ok", "seconds", "nodes": {...}, "findings": [...]}.')
def hosts_check(lab, inventory, accept_new, as_json) -> None:
    """doctor's checks on the inventory's hosts, over SSH: host keys, torch and Python versions, the
    socket interface, and the rendezvous and back-connect ports between every pair of hosts. Exit
    status 1 when something is wrong; each problem names the host and the fix."""
    from labctl import hosts as hosts_mod
    from labctl.ssh import SSHHosts, require_tools
    from labctl.ui import info

    require_tools("ssh")
    inv = _inventory(lab, inventory)
    started = time.monotonic()
    findings, facts = hosts_mod.check(SSHHosts(inv, accept_new=accept_new), info)
    _report_check(f"hosts of {inv.path}", findings, facts, time.monotonic() - started, as_json)


@hosts.command("sync", context_settings=CONTEXT)
@lab_option
@inventory_option
@accept_new_option
@_exclude_option
@click.option("--dry-run", is_flag=True, help="Print the rsync command for each host; change nothing.")
def hosts_sync(lab, inventory, accept_new, excludes, dry_run) -> None:
    """Mirror the workspace (the directory you run labctl from) to every host's workspace folder
    with rsync, leaving out virtual environments, .lab/ outputs, .git and caches, and write each
    host's env file there (under .lab/<name>/). Only a folder that is empty or was made by an
    earlier sync is mirrored into: --delete never empties a folder of yours."""
    import shlex

    from labctl import hosts as hosts_mod
    from labctl.ssh import SSHHosts, require_tools, rsync_push_argv, sync_excludes
    from labctl.ui import console, info

    require_tools("ssh", "rsync")
    inv = _inventory(lab, inventory)
    ssh_hosts = SSHHosts(inv, accept_new=accept_new)
    patterns = sync_excludes(_workspace(), excludes)
    if dry_run:
        for host in inv.hosts:
            console.print(f"[bold]{host.name}[/bold]: {shlex.join(rsync_push_argv(host, _workspace(), patterns))}",
                          markup=True, soft_wrap=True)
        return
    started = time.monotonic()
    stats = hosts_mod.sync(ssh_hosts, _workspace(), patterns, inv.env_files(), info)
    for host in inv.hosts:
        s = stats[host.name]
        info(f"{host.name} ({host.destination}): {s['files']} files changed, {s['bytes_sent'] / 1e3:,.1f} kB sent "
             f"to {host.workspace}")
    info(f"synced {len(inv.hosts)} hosts in {time.monotonic() - started:.1f} s; to run by hand on each:")
    for name, command in hosts_mod.manual_commands(ssh_hosts):
        console.print(f"[bold]{name}[/bold]: {command}", markup=True, soft_wrap=True)


@hosts.command("run", context_settings={**CONTEXT, "ignore_unknown_options": True, "allow_interspersed_args": False})
@lab_option
@inventory_option
@accept_new_option
@click.option("--nproc-per-node", metavar="P", help="Processes on every host [default: each host's nproc_per_node].")
@run_options
@click.option("--no-sync", is_flag=True, help="Run what is already on the hosts (only the env files are written).")
@_exclude_option
@click.option("--no-preflight", is_flag=True, help="Skip the checks (versions, interface) before the run.")
@click.option("--dry-run", is_flag=True, help="Print what each host would run; run nothing.")
@click.argument("script", nargs=-1, type=click.UNPROCESSED)
def hosts_run(lab, inventory, accept_new, nproc_per_node, launcher, timeout_s, pg_timeout_s, no_sync, excludes,
              no_preflight, dry_run, script) -> None:
    """Run TRAINING_SCRIPT [ARGS...] (or `-m module [ARGS...]`) on every host at once, as `labctl run`
    does on the lab: sync the workspace, write each host's env file, start torchrun on every host
    over SSH, stream the output prefixed with each host's name, and save the logs here under
    .lab/<name>/runs/. Ctrl-C, or any host failing, stops the job on every host.

    \b
    Examples:
      labctl hosts run --inventory cluster.toml -- -m trainer --epochs 3
      labctl hosts run -- my_ddp_script.py --lr 0.1      # the lab's nodes, after `labctl up --ssh`
    """
    from labctl import hosts as hosts_mod
    from labctl.launch import parse_script_args
    from labctl.ssh import require_tools, sync_excludes
    from labctl.ui import info

    nproc = _nproc_flag(nproc_per_node)
    _check_timeout(timeout_s)
    script_args = parse_script_args(list(script))
    require_tools("ssh", *([] if no_sync else ["rsync"]))
    inv = _inventory(lab, inventory)
    plan = hosts_mod.plan_run(inv, _workspace(), script_args, launcher=launcher, nproc_per_node=nproc,
                              pg_timeout_s=pg_timeout_s, accept_new=accept_new)
    if dry_run:
        _print_launches(plan.hosts, plan.launches)
        return
    if not no_preflight:
        started = time.monotonic()
        findings = hosts_mod.host_findings(inv, hosts_mod.connect(plan.hosts, info), nproc)
        _refuse_on_problems(f"hosts of {inv.path}", findings, time.monotonic() - started,
                            f"labctl hosts check --inventory {inv.path}")
    excluded = None if no_sync else sync_excludes(_workspace(), excludes)
    hosts_mod.execute_run(plan, _workspace(), excluded, timeout_s, info)


@main.command(context_settings=CONTEXT)
@lab_option
@click.argument("node", required=False)
@click.option("--run", "run_id", metavar="RUN_ID", help="Which run (a folder under .lab/<lab>/runs/); default the latest.")
@click.option("--container", is_flag=True, help="Show the node container's own log instead of a run's.")
def logs(lab, node, run_id, container) -> None:
    """Print the saved output of the latest run (every node, or NODE), or a node container's log."""
    from labctl import lab as lab_mod
    from labctl import runner

    config = _config(lab=lab)
    if container:
        client = lab_mod.docker_client()
        names = [node] if node else [n.name for n in lab_mod.lab_status(client, config.lab)]
        for name in names:
            click.echo(runner.container_log(client, config.lab, name), nl=False)
        return
    for name, text in runner.run_logs(lab_mod.lab_dir(_workspace(), config.lab), run_id, node):
        click.echo(f"==> {name} <==")
        click.echo(text, nl=False)


# ------------------------------------------------------------------------------------------ slow


@main.command(context_settings=CONTEXT)
@lab_option
@click.argument("node")
@click.option("--cpus", metavar="C", help="New CPU limit for the node, e.g. 0.25.")
@click.option("--clear", is_flag=True, help="Lift the node's CPU limit.")
def slow(lab, node, cpus, clear) -> None:
    """Make NODE a straggler (or stop it being one) while the lab runs: its CPU limit changes in
    place, no restart, so a run in progress feels it at once.

    \b
    Examples:
      labctl slow node2 --cpus 0.25
      labctl slow node2 --clear
    """
    from labctl import lab as lab_mod
    from labctl.config import parse_cpus
    from labctl.errors import ConfigError, LabError
    from labctl.ui import info

    if (cpus is None) == (not clear):
        raise LabError("give exactly one of --cpus C or --clear", hint="labctl slow node2 --cpus 0.25")
    limit = None
    if cpus is not None:
        try:
            limit = parse_cpus(cpus)
        except ValueError as exc:
            raise ConfigError("--cpus", cpus, str(exc)) from None
        if limit is None:
            raise ConfigError("--cpus", cpus, "must be a CPU count such as 0.25", hint="use --clear to lift the limit")
    config = _config(lab=lab)
    client = lab_mod.docker_client()
    names = [n.name for n in lab_mod.require_running(client, config.lab)]
    if node not in names:
        raise LabError(f"no node {node!r} in lab {config.lab}", hint=f"nodes: {', '.join(names)}")
    if limit is not None:
        lab_mod.check_cpus(client, {"--cpus": limit})
    applied = lab_mod.apply_node_cpus(client, config.lab, node, limit)
    info(f"{node}: CPU limit now {f'{applied:g} CPUs' if applied else 'none'} (read back from the engine)")


@main.command(context_settings=CONTEXT)
@lab_option
@click.argument("fault", type=click.Choice(["kill", "crash", "pause", "unpause", "partition", "heal"]))
@click.argument("node")
def fault(lab, fault, node) -> None:
    """Inject a fault into NODE: kill (node loss), crash (its training processes die, the node
    stays), pause / unpause (freeze it), partition / heal (cut its link, restore it).

    \b
    Examples:
      labctl fault crash node1        # torchrun --max-restarts brings the workers back
      labctl fault kill node2         # with --nnodes 2:3 the run goes on without it
      labctl fault partition node1 && sleep 5 && labctl fault heal node1
    """
    from labctl import faults
    from labctl import lab as lab_mod
    from labctl.ui import info

    config = _config(lab=lab)
    client = lab_mod.docker_client()
    info(faults.inject(client, config.lab, node, fault, config.iface))


@main.group(context_settings=CONTEXT)
def scenario() -> None:
    """The classic multi-node traps, reproduced on a throwaway lab, diagnosed and fixed."""


@scenario.command("list", context_settings=CONTEXT)
def scenario_list() -> None:
    """The scenarios, what each teaches, and its time bound."""
    from rich.table import Table

    from labctl.scenarios import SCENARIOS
    from labctl.ui import console

    table = Table(title="labctl scenario run NAME", title_justify="left", show_lines=True)
    for column in ("name", "trap", "bound", "what it teaches"):
        table.add_column(column)
    for s in SCENARIOS.values():
        table.add_row(s.name, s.title, f"{s.bound_s} s", s.lesson)
    console.print(table)


@scenario.command("run", context_settings=CONTEXT)
@click.argument("names", nargs=-1, required=True, metavar="NAME... | all")
@click.option("--json", "as_json", is_flag=True, help="Print the outcomes as a JSON list.")
def scenario_run(names, as_json) -> None:
    """Reproduce each trap on a fresh 2-node lab (scn-NAME), show torch's symptom and how long it
    took to show, doctor's diagnosis, then the fix and a run that succeeds. The lab is removed at
    the end. Exit status 0 when every fix worked within its bound."""
    from dataclasses import asdict, replace

    from rich.panel import Panel

    from labctl import lab as lab_mod
    from labctl.errors import LabError
    from labctl.scenarios import SCENARIOS, run_scenario
    from labctl.ui import console, info

    wanted = list(SCENARIOS) if list(names) == ["all"] else list(dict.fromkeys(names))
    unknown = [n for n in wanted if n not in SCENARIOS]
    if unknown:
        raise LabError(f"no scenario {', '.join(map(repr, unknown))}", hint=f"one of: {', '.join(SCENARIOS)}, or all")
    client = lab_mod.docker_client()
    outcomes = []
    for name in wanted:
        config = replace(_config(lab=f"scn-{name}"), nodes=2)
        outcome = run_scenario(client, config, _workspace(), SCENARIOS[name], info)
        outcomes.append(outcome)
        if not as_json:
            verdict = "[green]succeeded[/green]" if outcome.fixed_ok else "[bold red]still failing[/bold red]"
            body = "\n".join([
                f"[bold]symptom[/bold] (as torch prints it): {escape_markup(outcome.symptom or '(none: nothing torch printed says anything is wrong)')}",
                f"[bold]time to show[/bold]: {outcome.seconds_to_show:.1f} s (exit {outcome.broken_exit})",
                "[bold]doctor[/bold] ({:.1f} s): {}".format(outcome.doctor_seconds, escape_markup(
                    "; ".join(outcome.doctor) or "(nothing found)")),
                f"[bold]fix[/bold]: {escape_markup(outcome.fix)}",
                f"[bold]after the fix[/bold]: {verdict}, run took {outcome.fixed_seconds:.1f} s; "
                f"scenario {outcome.total_seconds:.0f} s of its {outcome.bound_s} s bound: "
                + ("[green]OK[/green]" if outcome.ok else "[bold red]FAILED[/bold red] (no symptom, no fix, or over the bound)"),
            ])
            console.print(Panel(body, title=f"{name}: {SCENARIOS[name].title}", title_align="left"), markup=True)
    if as_json:
        click.echo(json.dumps([{**asdict(o), "ok": o.ok} for o in outcomes]))
    if not all(o.ok for o in outcomes):
        sys.exit(1)


# ----------------------------------------------------------------------------------------- shape


def _links_table(links: dict, title: str):
    from rich.table import Table

    from labctl.shaping import describe

    table = Table(title=title, title_justify="left")
    table.add_column("node")
    table.add_column("link (read back from the kernel)")
    for node, state in links.items():
        table.add_row(node, describe(state))
    return table


def _link_json(node: str, state) -> dict:
    from labctl.shaping import describe

    return {"node": node, "shaping": describe(state), "rate_bps": state.rate_bps, "delay_us": state.delay_us,
            "jitter_us": state.jitter_us, "loss_pct": state.loss_pct, "ingress": state.ingress}


@main.command(context_settings=CONTEXT)
@lab_option
@click.option("--node", "node_names", multiple=True, metavar="NAME", help="Node to shape (repeatable); default every node.")
@click.option("--bw", metavar="RATE", help="Link rate in tc's bit units: 100mbit, 1gbit (not mbps: that is bytes).")
@click.option("--delay", metavar="TIME", help="Added one-way delay, e.g. 10ms (needs netem).")
@click.option("--jitter", metavar="TIME", help="Variation of the delay, e.g. 2ms (needs netem and --delay).")
@click.option("--loss", metavar="PCT", help="Random packet loss in percent, e.g. 1 (needs netem).")
@click.option("--ingress", is_flag=True, help="Also shape incoming traffic (through an ifb device).")
@click.option("--clear", is_flag=True, help="Remove all shaping from the nodes.")
@click.option("--show", is_flag=True, help="Show each node's shaping as the kernel reports it.")
@click.option("--json", "as_json", is_flag=True, help="With --show: print JSON.")
@click.option("--dry-run", is_flag=True, help="Print the exact tc commands per node; change nothing.")
def shape(lab, node_names, bw, delay, jitter, loss, ingress, clear, show, as_json, dry_run) -> None:
    """Shape the links of the lab's nodes (egress by default), clear them, or show them.

    \b
    Examples:
      labctl shape --bw 1gbit                    # every node at 1 Gbit/s
      labctl shape --node node2 --bw 100mbit     # one slow node drags the ring
      labctl shape --bw 100mbit --delay 10ms     # needs the kernel's netem
      labctl shape --show
    """
    from labctl import lab as lab_mod
    from labctl import netshape
    from labctl.errors import LabError
    from labctl.shaping import build_apply, build_clear, parse_shape
    from labctl.ui import console

    modes = [name for name, on in (("--bw", bw is not None), ("--clear", clear), ("--show", show)) if on]
    if len(modes) != 1:
        raise LabError(f"give exactly one of --bw, --clear or --show (got {', '.join(modes) or 'none'})",
                       hint="labctl shape --bw 100mbit  |  labctl shape --clear  |  labctl shape --show")
    if bw is None and (delay or jitter or loss or ingress):
        raise LabError("--delay, --jitter, --loss and --ingress go with --bw", hint="labctl shape --bw 1gbit --delay 5ms")
    wanted = parse_shape(bw, delay, jitter, loss, ingress) if bw is not None else None
    config = _config(lab=lab)
    client = lab_mod.docker_client()
    running = [n.name for n in lab_mod.require_running(client, config.lab)]
    unknown = [n for n in node_names if n not in running]
    if unknown:
        raise LabError(f"no node {', '.join(unknown)} in lab {config.lab}", hint=f"nodes: {', '.join(running)}")
    targets = list(dict.fromkeys(node_names)) or running
    if show:
        links = netshape.read_links(client, config.lab, targets, config.iface)
        if as_json:
            click.echo(json.dumps([_link_json(node, state) for node, state in links.items()]))
        else:
            console.print(_links_table(links, f"lab {config.lab}: links"))
        return
    commands = build_apply(wanted, config.iface) if wanted else build_clear(config.iface)
    if dry_run:
        for node in targets:
            click.echo(f"# {node} (helper container in its network namespace, NET_ADMIN)")
            click.echo(netshape.helper_script(commands), nl=False)
        return
    if wanted:
        netshape.apply_shape(client, config.lab, targets, wanted, config.iface)
    else:
        netshape.clear_shape(client, config.lab, targets, config.iface)
    console.print(_links_table(netshape.read_links(client, config.lab, targets, config.iface), f"lab {config.lab}: links"))


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

    from labctl.cost import PRESETS, Link, parse_params, resolve_link, step_report
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
    from labctl import lab as lab_mod
    from labctl import netshape
    from labctl.errors import LabError
    from labctl.units import format_rate

    config = _config(lab=lab)
    try:
        client = lab_mod.docker_client()
        nodes = [n.name for n in lab_mod.require_running(client, config.lab)]
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

    from labctl.bench import bench_up
    from labctl.lab import docker_client
    from labctl.ui import console, info

    counts = _nodes_list(nodes_list)
    client = docker_client()
    results = bench_up(client, _workspace(), counts, repeats, info)
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

    from labctl import lab as lab_mod
    from labctl import linkbench, netshape, runner
    from labctl.units import format_rate, parse_size_range
    from labctl.ui import console, info

    size_list = parse_size_range(sizes)
    config = _config(lab=lab)
    client = lab_mod.docker_client()
    nodes = lab_mod.require_running(client, config.lab)
    if len(nodes) < 2:
        from labctl.errors import LabError

        raise LabError(f"lab {config.lab} has {len(nodes)} node; an allreduce across nodes needs 2 or more",
                       hint=f"labctl up --lab {config.lab} --nodes 3")
    names = [n.name for n in nodes]
    lab_directory = lab_mod.lab_dir(_workspace(), config.lab)
    node_env = runner.read_node_envs(lab_directory, names)
    bottleneck = netshape.slowest_link(netshape.read_links(client, config.lab, names, config.iface))
    slowest, link_bps = bottleneck or (names[0], None)
    neighbour = names[(names.index(slowest) + 1) % len(names)]
    ip_of = {n.name: n.ip for n in nodes}
    info(f"measuring the wire {slowest} -> {neighbour} with iperf3 ({linkbench.IPERF_SECONDS} s)")
    wire_bps = linkbench.measure_wire(client, config.lab, slowest, neighbour, ip_of[neighbour])
    run_id, run_dir = runner.new_run(lab_directory)
    info(f"allreduce sweep on {len(names)} nodes, {len(size_list)} sizes x {iters} iterations (logs: {run_dir})")
    timings = linkbench.run_sweep(client, config.lab, node_env, size_list, iters, run_dir, run_id)
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
    from labctl import lab as lab_mod
    from labctl import netshape, runner, scaling
    from labctl.errors import ConfigError, LabError
    from labctl.shaping import Shape
    from labctl.ui import console, info
    from labctl.units import parse_rate

    config = _config(lab=lab)
    shaped = [] if list(rates) == ["none"] else [(r, parse_rate(r, "--bw")) for r in (rates or ("1gbit", "100mbit"))]
    client = lab_mod.docker_client()
    nodes = lab_mod.require_running(client, config.lab)
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
    lab_directory = lab_mod.lab_dir(_workspace(), config.lab)
    node_env = runner.read_node_envs(lab_directory, names)
    out = out_dir or lab_directory / "bench-scaling"
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
            summary = scaling.run_lab(client, config.lab, node_env, c, trainer_args, lab_directory)
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

    from labctl import lab as lab_mod
    from labctl import runner, scaling
    from labctl.config import parse_cpus
    from labctl.errors import ConfigError, LabError
    from labctl.ui import console, info

    try:
        limit = parse_cpus(cpus)
    except ValueError as exc:
        raise ConfigError("--cpus", cpus, str(exc)) from None
    if limit is None:
        raise ConfigError("--cpus", cpus, "must be a CPU count such as 0.25")
    config = _config(lab=lab)
    client = lab_mod.docker_client()
    names = [n.name for n in lab_mod.require_running(client, config.lab)]
    if len(names) < 2:
        raise LabError(f"lab {config.lab} has {len(names)} node; a straggler needs others to wait for it",
                       hint=f"labctl up --lab {config.lab} --nodes 3")
    node = node or names[-1]
    if node not in names:
        raise LabError(f"no node {node!r} in lab {config.lab}", hint=f"nodes: {', '.join(names)}")
    lab_mod.check_cpus(client, {"--cpus": limit})
    lab_directory = lab_mod.lab_dir(_workspace(), config.lab)
    node_env = runner.read_node_envs(lab_directory, names)
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
            even = scaling.run_lab(client, config.lab, node_env, every, base_args, lab_directory)
            runs["even"].append(even)
            info(f"round {round_}, even split {even['micro_batches']}: {even['tokens_per_s']:,.0f} tokens/s, "
                 f"slowest {even['slowest_node']}, others waited {even['waited_for_slowest_s']:.2f} s")
            if override is None:
                per_sample = scaling.compute_ms_per_sample(Path(even["run_dir"]), even["micro_batches"], even["accum_steps"])
                sizes = scaling.balanced_micro_batches(global_batch, per_sample)
                override = ",".join(f"{rank}={size}" for rank, size in enumerate(sizes))
            balanced = scaling.run_lab(client, config.lab, node_env, every,
                                       base_args + ["--rank-micro-batch", override], lab_directory)
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


if __name__ == "__main__":
    main()
