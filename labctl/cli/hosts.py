"""Real machines over SSH: `labctl hosts check|sync|run`."""

from __future__ import annotations

import sys

import click

from labctl.api import RunOptions
from labctl.api.inputs import build_user_env
from labctl.cli.app import CONTEXT, invocation, main
from labctl.cli.lazy import render
from labctl.cli.options import (
    SCRIPT_CONTEXT,
    accept_new_option,
    dry_run_option,
    env_options,
    exclude_option,
    inventory_option,
    json_option,
    lab_option,
    nccl_debug_option,
    nproc_option,
    package_options,
    package_settings,
    run_options,
    script_argument,
)


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


@hosts.command("check", context_settings=CONTEXT)
@lab_option
@inventory_option
@accept_new_option
@json_option('Print {"ok", "seconds", "nodes": {...}, "findings": [...]}.')
def hosts_check(lab, inventory, accept_new, as_json) -> None:
    """doctor's checks on the inventory's hosts, over SSH: host keys, torch and Python versions, the
    socket interface, and the rendezvous and back-connect ports between every pair of hosts. Exit
    status 1 when something is wrong; each problem names the host and the fix."""
    if not render.report_check(invocation().hosts(lab, inventory, accept_new).check(), as_json):
        sys.exit(1)


@hosts.command("sync", context_settings=CONTEXT)
@lab_option
@inventory_option
@accept_new_option
@exclude_option
@package_options
@dry_run_option("Print the rsync command for each host; change nothing.")
def hosts_sync(lab, inventory, accept_new, excludes, requirements, with_packages, dry_run) -> None:
    """Mirror the workspace (the directory you run labctl from) to every host's workspace folder
    with rsync, leaving out virtual environments, .lab/ outputs, .git and caches, and write each
    host's env file there (under .lab/<name>/). Only a folder that is empty or was made by an
    earlier sync is mirrored into: --delete never empties a folder of yours.

    Every host also gets the same packages: those of --requirements and --with, resolved for the
    hosts' Python into .lab/<name>/pylock.toml, else that lock where it exists (the lab's own, for
    the inventory `labctl up --ssh` writes). The wheels go over with rsync (the hosts need no index),
    each host's Python installs them into .lab/<name>/packages-<hash>, and its env file puts that
    folder first on PYTHONPATH; `labctl hosts check` then compares every host with the lock."""
    where = invocation()
    the_hosts = where.hosts(lab, inventory, accept_new)
    if dry_run:
        render.print_host_commands(the_hosts.sync_commands(excludes))
        return
    config = where.config(**package_settings(requirements, with_packages, where.cwd))
    render.print_sync(the_hosts, the_hosts.sync(excludes, requirements=config.requirements,
                                                with_packages=config.with_packages))


@hosts.command("run", context_settings=SCRIPT_CONTEXT)
@lab_option
@inventory_option
@accept_new_option
@nproc_option("Processes on every host [default: each host's nproc_per_node].")
@run_options
@env_options
@nccl_debug_option
@click.option("--no-sync", is_flag=True, help="Run what is already on the hosts (only the env files are written).")
@exclude_option
@click.option("--no-preflight", is_flag=True, help="Skip the checks (versions, interface) before the run.")
@dry_run_option("Print what each host would run; run nothing.")
@script_argument
def hosts_run(lab, inventory, accept_new, nproc_per_node, launcher, timeout_s, pg_timeout_s, as_json, env_pairs,
              env_files, nccl_debug, no_sync, excludes, no_preflight, dry_run, script) -> None:
    """Run TRAINING_SCRIPT [ARGS...] (or `-m module [ARGS...]`) on every host at once, as `labctl run`
    does on the lab: sync the workspace, write each host's env file, start torchrun on every host
    over SSH, stream the output prefixed with each host's name, and save the logs here under
    .lab/<name>/runs/. Ctrl-C, or any host failing, stops the job on every host.

    --nproc_per_node, torchrun's spelling, works too. A relative TRAINING_SCRIPT is taken from where
    you stand: each host runs that file of its copy of the workspace.

    \b
    Examples:
      labctl hosts run --inventory cluster.toml -- -m trainer --epochs 3
      labctl hosts run -e NCCL_DEBUG=INFO -- my_ddp_script.py --lr 0.1   # the nodes of `up --ssh`
    """
    where = invocation()
    options = RunOptions(launcher=launcher, nproc_per_node=nproc_per_node, pg_timeout_s=pg_timeout_s,
                         env=build_user_env(env_pairs, env_files, where.environ, nccl_debug), cwd=where.cwd,
                         timeout_s=timeout_s, sync=not no_sync, excludes=excludes,
                         echo="stderr" if as_json else True, check=not as_json)
    the_hosts = where.hosts(lab, inventory, accept_new)
    plan = the_hosts.plan_run(*script, options=options)
    if dry_run:
        render.print_launches(plan.job, plan.hosts.address)
        return
    if not no_preflight:
        render.print_preflight(the_hosts.preflight(plan, nproc_per_node), the_hosts.full_check)
    result = the_hosts.execute(plan, sync=options.sync, excludes=options.excludes, echo=options.echo,
                               check=options.check)
    render.finish_run(result, as_json)
