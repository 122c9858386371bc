"""The lab's lifecycle: build, up, status, down, env, logs, exec, ls."""

from __future__ import annotations

import functools
import logging
import os
import shlex
import sys
import time
from pathlib import Path

import click

from labctl.api.inputs import OVERLAYS
from labctl.cli.app import CONTEXT, invocation, main
from labctl.cli.lazy import render
from labctl.cli.options import (
    FilePath,
    SCRIPT_CONTEXT,
    dry_run_option,
    json_option,
    lab_option,
    nproc_option,
    package_options,
    package_settings,
    spec_help,
    torchrun_option,
)
from labctl.core.ui import BuildProgress, info, stdout_console


@main.command(context_settings=CONTEXT)
@click.option("--torch-version", metavar="X.Y.Z", help=spec_help("torch_version", "torch release to pin"))
@click.option("--cuda", is_flag=True,
              help="Build the GPU node image instead (Dockerfile.cuda, ddplab-node:torch<VERSION>-cuda): torch's CUDA "
                   "build, about 2.8 GB of wheels through pip's index, once per release.")
@click.option("--base-image", metavar="IMAGE", help=spec_help("base_image", "Base image"))
@click.option("--image", metavar="TAG", help=spec_help("image", "Tag of the node image",
                                                       default="ddplab-node:torch<VERSION>-cpu"))
@click.option("--force", is_flag=True, help="Build even if an image with the same inputs exists.")
@click.option("--verbose", "verbose_build", is_flag=True, help="Print every line of the build's output.")
@click.option("--mismatch-image", is_flag=True,
              help="Also build the image with another torch release that `scenario run version-mismatch` puts on one "
                   "node (the CUDA image at torch 2.14.1).")
@click.option("--print-hash", is_flag=True,
              help="Print the hash of the image's inputs (after fetching the base image and the wheels it is "
                   "computed from; for the CUDA image, only the wheels' names) and build nothing: a CI cache key "
                   "for a saved image.")
@click.option("--lean", is_flag=True,
              help="Keep only the images: remove a build's intermediate stages (the venv torch is installed in, as "
                   "big as the image again: about 8 GB for a CUDA image) and the wheelhouse's wheels (2.8 GB for "
                   "CUDA), also where the image was up to date. For a machine that builds once, such as CI; a later "
                   "build for another torch or other wheels fetches them and installs torch again (minutes), one for "
                   "a changed trainer only puts it on the runtime image (seconds).")
@json_option("With --print-hash: one JSON document (tag, hash, the existing image's hash, up_to_date, base, context, "
             "runtime).")
def build(torch_version, cuda, base_image, image, force, verbose_build, mismatch_image, print_hash, lean,
          as_json) -> None:
    """Build the node image (torch CPU build, iproute2, iperf3, the trainer); with --cuda, the GPU
    node image (torch's CUDA build, same release, same node otherwise).

    Works without a registry: when the base image cannot be pulled, a local Debian base is built
    with debootstrap, and Python packages come from a wheelhouse the host fills with pip.
    """
    if as_json and not print_hash:
        raise click.UsageError("--json goes with --print-hash (a build reports on stderr)")
    if print_hash and (force or mismatch_image or lean):
        raise click.UsageError("--print-hash builds nothing: it does not go with --force, --mismatch-image or --lean")
    if cuda and image:
        raise click.UsageError(f"--image {image} names the CPU image; the CUDA image is always "
                               "ddplab-node:torch<VERSION>-cuda (tag it yourself with docker tag)")
    config = invocation().config(torch_version=torch_version, base_image=base_image, image=image)
    here = invocation().here()
    if print_hash:
        render.print_build_hash(*here.image_inputs(config, cuda=cuda), as_json)
        return
    progress = functools.partial(BuildProgress, verbose_build)
    for what, built in here.build_images(config, progress, force=force, cuda=cuda, mismatch=mismatch_image,
                                         lean=lean):
        state = "up to date" if built.cached else "built"
        info(f"image {built.tag} {state} (base {built.base}, {what}) in {built.seconds:.1f} s")


@main.command(context_settings=CONTEXT)
@lab_option
@click.option("--nodes", metavar="N", help=spec_help("nodes", "Number of nodes, 1-64", note="a running lab keeps its count"))
@nproc_option(spec_help("nproc_per_node", "Processes per node for torchrun"))
@click.option("--cpus", metavar="C", help=spec_help("cpus", "CPU limit per node, e.g. 0.5"))
@click.option("--memory", metavar="SIZE", help=spec_help("memory", "Memory limit per node, e.g. 2g"))
@click.option("--subnet", metavar="CIDR", help=spec_help("subnet", "Lab network, e.g. 172.28.5.0/24, or auto"))
@torchrun_option("--master-port", metavar="PORT", help=spec_help("master_port", "Rendezvous port on node0, 1024-65535"))
@click.option("--image", metavar="TAG", help="Node image [env DDPLAB_IMAGE].")
@click.option("--bw", metavar="RATE", help="Shape every node's link at bring-up, e.g. 1gbit (as `labctl shape --bw`) "
                                           "[env DDPLAB_BW].")
@click.option("--node-cpus", metavar="NODE=C,...", help="Per-node CPU limits over --cpus, e.g. node2=0.25 (a straggler) "
                                                        "[env DDPLAB_NODE_CPUS].")
@click.option("--ssh/--no-ssh", default=None,
              help=spec_help("ssh", "Make every node an SSH host and write .lab/<lab>/hosts.toml for `labctl hosts`",
                             default="as the running lab is; off for a new one"))
@click.option("--gpus", metavar="all|N|LIST",
              help=spec_help("gpus", "The machine's GPUs the lab gets: all, the first N, or indices such as 0,2 (GPU 1 "
                                     "alone: 1,); nodes take them in order, --gpus-per-node each"))
@click.option("--gpus-per-node", metavar="K",
              help=spec_help("gpus_per_node", "GPUs each GPU node gets; nodes beyond the GPUs are CPU nodes"))
@click.option("--cuda", metavar="all|N|NODES",
              help=spec_help("cuda", "Nodes on the CUDA image: all, the first N, or names such as node0,node1; without a "
                                     "GPU they train with gloo on CPU", default="the GPU nodes"))
@click.option("--nccl-transport", type=click.Choice(["socket", "auto"], case_sensitive=False),
              help=spec_help("nccl_transport", "socket: NCCL between GPU nodes goes over the lab network, where "
                             "`labctl shape` acts on it; auto: NCCL may use P2P or shared memory between GPUs of this "
                             "machine, faster but unshaped"))
@click.option("--tcp-cc", metavar="NAME|host",
              help=spec_help("tcp_cc", "TCP congestion control of the nodes' sockets, e.g. cubic or bbr; host keeps the "
                                       "host's", note="so shaped links measure the same on every host"))
@click.option("--cpu-kernels", type=click.Choice(["avx2", "native"], case_sensitive=False),
              help=spec_help("cpu_kernels", "avx2: the nodes' CPU kernels (torch, MKL, oneDNN) held to AVX2, so runs "
                             "end at the same loss and checksum on every x86 host; native: each host's best, faster "
                             "where it has AVX-512, but its numbers differ"))
@click.option("--warm", type=click.Choice(["auto", "on", "off"], case_sensitive=False),
              help=spec_help("warm", "A fork server in every node, torch imported, so runs start in about a second: "
                             "auto (on while they take at most 40% of the engine's memory, about 230 MB each), on or "
                             "off"))
@click.option("--idle-imports", type=click.Choice(["on", "off"], case_sensitive=False),
              help=spec_help("idle_imports", "What each fork server imports once idle: on (torch._dynamo, which a "
                             "first optimizer and torch.compile need, so later runs find it imported) or off (a lab "
                             "of one or two jobs: each node saves 1.4 to 2.4 CPU-seconds, and a run that needs it "
                             "imports it itself)"))
@click.option("--scheduler", type=click.Choice(["none", "slurm"], case_sensitive=False), default=None,
              help=spec_help("scheduler", "slurm: the nodes also form a Slurm cluster for `labctl slurm`",
                             note="a running lab keeps its own"))
@click.option("--overlay", type=click.Choice(OVERLAYS, case_sensitive=False), default=None,
              help=spec_help("overlay", "A mesh VPN between the nodes, WireGuard in user space: tailscale (tailscale0, "
                             "100.64.0.0/10, MTU 1280), wireguard (wg0, MTU 1420) or none",
                             default="as the running lab is; none for a new one"))
@package_options
@click.option("--preload", multiple=True, metavar="MODULE",
              help="A module each node's fork server imports besides torch and numpy, so a run's workers find it "
                   "imported, e.g. lightning; repeat or comma-separate [env DDPLAB_PRELOAD; a running lab keeps its "
                   "own].")
@click.option("--torch-version", metavar="X.Y.Z",
              help=spec_help("torch_version", "The torch release the nodes run; its node image is built first where "
                                              "missing"))
@dry_run_option("Print each node's GPUs and image, and the Compose file and env files that would be used; "
                "change nothing (refused as `up` is where the machine cannot give the GPUs).")
@json_option("Print the node table as JSON (as `status --json`).")
def up(lab, dry_run, as_json, requirements, with_packages, preload, **settings) -> None:
    """Start (or reconcile) the lab: nodes node0..node{N-1} on their own bridge network.

    On a running lab, `up` reconciles instead of failing: `--nodes 5` on a 3-node lab adds two
    nodes (and rewrites every env file, since NNODES changed); without `--nodes` it keeps the count.

    With --ssh every node also runs sshd (as the node's own user, with a host key of its own) for a
    key pair made for the lab, and .lab/<lab>/hosts.toml describes the nodes as real hosts: their
    addresses, the user, the key and a known_hosts file, for `labctl hosts check|sync|run`.

    With --gpus, nodes get the machine's GPUs and run the CUDA image (`labctl build --cuda`); every
    node's env file then says which backend the job uses: nccl when every node has a GPU, gloo when
    GPU and CPU nodes mix. A running lab keeps its GPUs unless --gpus or --cuda is given.

    Every option has a DDPLAB_* setting (.env, the environment) that it overrides; they make one
    lab spec, as `labctl.api.Lab(...)` and the pytest marker do. The options torchrun has too take
    its spellings as well (--nproc_per_node, --master_port).

    With --requirements and --with, every node also gets your project's packages: resolved once on
    this machine for the nodes' Python, written as .lab/<lab>/pylock.toml, and installed into one
    image every node runs (made once per lock). A running lab keeps its packages unless told
    otherwise; `--requirements none` takes them away.

    \b
    Examples:
      labctl up --nodes 3
      labctl up --nodes 3 --with tqdm
      labctl up --requirements requirements.txt --preload lightning
      labctl up --requirements pyproject.toml:train
    """
    settings.update(package_settings(requirements, with_packages, invocation().cwd), preload=tuple(preload) or None)
    the_lab = invocation().lab(lab, **settings)
    if dry_run:
        render.print_up_plan(the_lab.plan_up(dry_run=True), the_lab.directory)
        return
    result = the_lab.up()
    render.print_nodes(the_lab.name, result.nodes, result.links, as_json,
                       f"lab {the_lab.name} ({result.subnet}), up in {result.seconds:.1f} s")


@main.command(context_settings=CONTEXT)
@lab_option
@json_option('Print {"lab": ..., "nodes": [{"name", "ip", "torch", "state", "packages", "link"}]}.')
def status(lab, as_json) -> None:
    """Show each node as Docker sees it now: IP, torch version, state, the hash of its packages
    (`up --requirements/--with`), and its link as the kernel reports it (read back with tc, not from
    a cache)."""
    the_lab = invocation().lab(lab)
    nodes = the_lab.status()
    links = the_lab.links([n.name for n in nodes if n.state == "running"])
    if not nodes and not as_json:
        info(f"lab {the_lab.name} is not up (`labctl up --lab {the_lab.name}` starts it)")
        return
    render.print_nodes(the_lab.name, nodes, links, as_json, calibrated=the_lab.link_calibration(),
                       overlay=the_lab.overlay())


@main.command(context_settings=CONTEXT)
@lab_option
@click.option("--volumes", is_flag=True, help="Also remove the lab's shared volume (kept by default, like compose).")
@dry_run_option("List what would be removed; remove nothing.")
def down(lab, volumes, dry_run) -> None:
    """Remove every container and network of the lab. Idempotent; also cleans up a broken `up`.

    The shared volume (/shared on every node) is kept unless --volumes is given, as `docker compose
    down` keeps it; `down` names it when it does. Run logs and env files under .lab/<lab>/ stay.
    """
    the_lab = invocation().lab(lab)
    if dry_run:
        for kind, names in the_lab.resources(volumes).items():
            stdout_console().print(f"{kind}: {', '.join(names) or '-'}", markup=False)
        return
    removed = the_lab.down(volumes=volumes)
    render.print_down(the_lab.name, removed, the_lab.resources(volumes=True))


@main.command(context_settings=CONTEXT)
@click.option("--hosts", metavar="ADDR1,ADDR2,...", help="Addresses of the machines; the first hosts the rendezvous.")
@click.option("--iface", metavar="IFACE", help="Interface that carries those addresses, e.g. tailscale0, eth0.")
@nproc_option("Processes per machine [default 1].")
@torchrun_option("--master-port", metavar="PORT", help="Rendezvous port on the first host [default 29500].")
@torchrun_option("--rdzv-id", default="ddplab", show_default=True, metavar="ID", help="Rendezvous id, the same on every host.")
@click.option("--overlay", "on_overlay", is_flag=True,
              help="Instead of --hosts: the lab's own nodes on its overlay (`up --overlay`), MASTER_ADDR node0's "
                   "overlay address and the sockets on the tunnel, for a run by hand in the nodes.")
@lab_option
@click.option("--out", "out_dir", type=FilePath(path_type=Path), default=None,
              help="Directory for the env files [default .lab/hosts; with --overlay .lab/<lab>/overlay-env].")
def env(hosts, iface, nproc_per_node, master_port, rdzv_id, on_overlay, lab, out_dir) -> None:
    """Write the same per-node env files for real machines, and print the command for each; or, with
    --overlay, the lab's nodes' env files on its mesh VPN.

    The options torchrun has too take its spellings as well (--nproc_per_node, --master_port, --rdzv_id).
    """
    if on_overlay:
        the_lab = invocation().lab(lab)
        paths = the_lab.write_overlay_env(out_dir or the_lab.directory / "overlay-env")
        info(f"wrote {len(paths)} env files to {paths[0].parent}/ (every node sees the workspace at the same path)")
        for path in paths:
            where = "" if the_lab.name == "ddplab" else f"--lab {the_lab.name} "
            shown = path.relative_to(the_lab.workspace) if path.is_relative_to(the_lab.workspace) else path  # the nodes' cwd
            stdout_console().print(f"[bold]{path.stem}[/bold]:  labctl exec {where}{path.stem} -- sh -c 'set -a; . {shown}; "
                                   "set +a; torchrun SCRIPT'", markup=True, soft_wrap=True)
        return
    if hosts is None or iface is None:
        raise click.UsageError("give --hosts and --iface (real machines), or --overlay (the lab's nodes on its overlay)")
    config = invocation().config(iface=iface, nproc_per_node=nproc_per_node, master_port=master_port)
    out_dir = out_dir or Path(".lab/hosts")
    addresses, paths, commands = invocation().here().write_host_env(hosts, config, rdzv_id, out_dir)
    info(f"wrote {len(paths)} env files to {out_dir}/ (copy each to its machine, same path)")
    for name, host, command in commands:
        stdout_console().print(f"[bold]{name}[/bold] ({host}):  {command}", markup=True, soft_wrap=True)
    info(f"open TCP {config.master_port} on {addresses[0]}, and ephemeral ports between all hosts (gloo/NCCL connect back)")


@main.command(context_settings=CONTEXT)
@lab_option
@click.argument("node", required=False)
@click.option("--run", "run_id", metavar="RUN_ID", help="Which run (a folder under .lab/<lab>/runs/); default the latest.")
@click.option("--container", is_flag=True, help="Show the node container's own log instead of a run's.")
@click.option("-n", "--tail", type=int, metavar="N", help="Only each node's last N lines.")
@click.option("-f", "--follow", is_flag=True,
              help="Keep printing new lines as they are written, until the run ends (with --container: until "
                   "the containers stop); Ctrl-C stops sooner.")
def logs(lab, node, run_id, container, tail, follow) -> None:
    """Print the saved output of the latest run (every node, or NODE), or a node container's log.

    With -f, what is there (with --tail, each node's last N lines) and then every new line, under
    a header naming its node, until the run has ended: `labctl logs -f` in a second terminal
    watches a run that `labctl run` started.
    """
    the_lab = invocation().lab(lab)
    if follow:
        chunks = the_lab.follow_container_logs(node, tail) if container else the_lab.follow_logs(node, run_id, tail)
        try:
            render.print_log_stream(chunks, headers=node is None)
        except KeyboardInterrupt:
            raise click.exceptions.Exit(130) from None  # Ctrl-C ends a follow as it ends `tail -f`: quietly
    elif container:
        render.print_logs(the_lab.container_logs(node, tail))
    else:
        render.print_logs(the_lab.logs(node, run_id, tail))


@main.command("exec", context_settings=SCRIPT_CONTEXT)
@lab_option
@click.argument("node")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def exec_cmd(lab, node, command) -> None:
    """Run COMMAND in NODE's container: `labctl exec node1 -- hostname`, `labctl exec node0 -- bash`.

    As the node's user, in the workspace, with the node's environment (its env file: MASTER_ADDR,
    NODE_RANK, ...), through `docker exec`; with a terminal when labctl has one (a shell is then
    interactive), with stdin passed through otherwise. The exit status is COMMAND's. labctl's own
    options go before NODE.
    """
    tty = sys.stdin.isatty() and sys.stdout.isatty()
    argv = invocation().lab(lab).exec_argv(node, list(command), tty=tty)
    logging.getLogger("labctl.exec").debug("$ %s", shlex.join(argv))  # `labctl -v` shows every external command
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp(argv[0], argv)  # docker's exit status, which is the command's, becomes labctl's


@main.command("ls", context_settings=CONTEXT)
@json_option('Print [{"lab", "running", "nodes", "shaping", "created", "age_s", "workspace", "user", ...}].')
def ls(as_json) -> None:
    """List the labs on this engine, whoever brought them up: nodes running/total, each running
    node's link (read back with tc), age, and the workspace and user that own it.

    A lab with no nodes left but its volume (after `down` without --volumes) is listed too.
    """
    render.print_labs(invocation().here().labs(), as_json, now=time.time())


@main.command("gc", context_settings=CONTEXT)
@click.option("--all", "everything", is_flag=True, help="Remove every ddplab lab on this engine, whoever owns it.")
@dry_run_option("Say what would be removed and why; remove nothing.")
@json_option('Print [{"lab", "remove", "why"}]; the package images are said on stderr.')
def gc(everything, dry_run, as_json) -> None:
    """Remove the labs whose owner process is gone: a test session killed with -9, a script that
    crashed inside `with Lab(...)`. Labs from `labctl up` have no owner process and are kept
    (`--all` removes them too). Containers, networks and volumes go; run logs in the workspace stay.

    Then the package images (your project's packages on a node image, one per lock) that no lab's
    node runs any more: the next `up` that asks for one makes it again from the cached wheels.
    """
    labs, images = invocation().here().gc(everything=everything, dry_run=dry_run)
    render.print_gc(labs, images, dry_run, as_json)
