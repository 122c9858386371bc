"""Running a job on the lab's nodes: `labctl run`."""

from __future__ import annotations

import click

from labctl.api import RunOptions
from labctl.api.inputs import build_user_env
from labctl.cli.app import invocation, main
from labctl.cli.lazy import render, render_trace
from labctl.cli.options import (
    SCRIPT_CONTEXT,
    dry_run_option,
    env_options,
    lab_option,
    nccl_debug_option,
    nproc_option,
    run_options,
    script_argument,
    torchrun_option,
)


@main.command(context_settings=SCRIPT_CONTEXT)
@lab_option
@nproc_option("Processes per node [default: the lab's, from its env files].")
@run_options
@env_options
@nccl_debug_option
@dry_run_option("Print the command each node would run; run nothing.")
@click.option("--no-preflight", is_flag=True, help="Skip doctor's cheap checks (env, versions, interface) before the run.")
@torchrun_option("--max-restarts", type=click.IntRange(0, 100), default=0, show_default=True, metavar="K",
                 help="torchrun restarts every worker up to K times after a failure (the trainer resumes from its "
                      "checkpoint).")
@click.option("--nnodes", metavar="MIN:MAX", help="Elastic node range, MAX = the lab's nodes: the run goes on with MIN survivors.")
@click.option("--trace", is_flag=True, help="After a run that succeeded, `labctl trace` it: the timeline PNG, the merged "
                                            "trace and the table per rank (in --json's document as \"trace\").")
@click.option("--fresh-compile-cache", is_flag=True,
              help="Empty the nodes' torch.compile cache first (on the lab's shared volume): this run compiles from "
                   "nothing and fills it again.")
@click.option("--ifname", metavar="IFACE",
              help="The interface the ranks' sockets use (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME): on a lab with an "
                   "overlay its tunnel (tailscale0, wg0), the rendezvous on node0's overlay address; eth0 for the "
                   "bridge [default: the tunnel where the lab has an overlay, else eth0].")
@script_argument
def run(lab, nproc_per_node, launcher, timeout_s, pg_timeout_s, as_json, env_pairs, env_files, nccl_debug, dry_run,
        no_preflight, max_restarts, nnodes, trace, fresh_compile_cache, ifname, script) -> None:
    """Run TRAINING_SCRIPT [ARGS...] (or `-m module [ARGS...]`) on every node at once.

    The options torchrun has too take its spellings as well (--nproc_per_node, --max_restarts).
    A relative TRAINING_SCRIPT is taken from where you stand; the run's working directory is the
    workspace (the nearest folder upwards with a .lab/ folder), which every node sees at the same path.

    \b
    Examples:
      labctl run -- -m trainer --epochs 3
      labctl run --nproc_per_node 2 -e NCCL_DEBUG=INFO -- my_ddp_script.py --lr 0.1
      labctl run --nccl-debug -- -m trainer --backend nccl
      labctl run --launcher static --env-file run.env -- my_ddp_script.py
      labctl run --trace -- -m trainer --workload gpt --steps 60
      labctl run --fresh-compile-cache -- -m trainer --compile --workload gpt
      labctl run --ifname eth0 -- -m trainer    # on an overlay lab: the bridge, to compare
    """
    where = invocation()
    the_lab = where.lab(lab)
    options = RunOptions(launcher=launcher, nproc_per_node=nproc_per_node, max_restarts=max_restarts, nnodes=nnodes,
                         pg_timeout_s=pg_timeout_s, env=build_user_env(env_pairs, env_files, where.environ, nccl_debug),
                         cwd=where.cwd, timeout_s=timeout_s, ifname=ifname, echo="stderr" if as_json else True,
                         check=not as_json)
    plan = the_lab.plan_run(*script, options=options)
    if dry_run:
        render.print_launches(plan, the_lab.nodes().address)
        return
    if not no_preflight:
        render.print_preflight(the_lab.preflight(nproc_per_node, options.env), f"labctl doctor --lab {the_lab.name}")
    if fresh_compile_cache:
        render.print_cleared_caches(the_lab.clear_compile_cache())
    result = the_lab.execute(plan, echo=options.echo, check=options.check)
    traced = the_lab.trace(result) if trace and result.ok else None
    if traced is not None and not as_json:
        render_trace.print_trace(traced, False)
    render.finish_run(result, as_json, {"trace": traced.as_dict()} if traced is not None else None)
