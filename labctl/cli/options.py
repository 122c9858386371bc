"""Options more than one command takes, defined once."""

from __future__ import annotations

import click

from labctl.cli.app import CONTEXT

# Commands that pass everything after their options to the training script.
SCRIPT_CONTEXT = {**CONTEXT, "ignore_unknown_options": True, "allow_interspersed_args": False}


def lab_option(f):
    return click.option("--lab", metavar="NAME", help="Lab name [env DDPLAB_LAB; default ddplab].")(f)


def json_option(help_text: str):
    return click.option("--json", "as_json", is_flag=True, help=help_text)


def dry_run_option(help_text: str):
    return click.option("--dry-run", is_flag=True, help=help_text)


def run_options(f):
    """What `labctl run` and `labctl hosts run` both take: the launcher, the two timeouts, --json."""
    f = json_option("Print the run's outcome as one JSON document on stdout (exit status, each node's, the root "
                    "cause, the SUMMARY); node output goes to stderr.")(f)
    f = click.option("--pg-timeout-s", type=click.FloatRange(1, 3600), default=30.0, show_default=True, metavar="S",
                     help="Process-group timeout for the trainer (DDPLAB_PG_TIMEOUT_S): a dead peer fails "
                          "collectives after S.")(f)
    f = click.option("--timeout-s", type=float, default=None, metavar="S",
                     help="Stop the run everywhere after S seconds (default: no limit).")(f)
    return click.option("--launcher", type=click.Choice(["torchrun", "static"]), default="torchrun",
                        show_default=True, help="torchrun (c10d rendezvous) or static (RANK/WORLD_SIZE/MASTER_ADDR "
                                                "exported, plain python).")(f)


def inventory_option(f):
    return click.option("--inventory", metavar="FILE",
                        help="The hosts (TOML) [env DDPLAB_INVENTORY; default .lab/<lab>/hosts.toml, "
                             "as `labctl up --ssh` writes it].")(f)


def accept_new_option(f):
    return click.option("--accept-new", is_flag=True,
                        help="Record the host key of a host seen for the first time (a changed key is still refused).")(f)


def exclude_option(f):
    return click.option("--exclude", "excludes", multiple=True, metavar="PATTERN",
                        help="Also leave PATTERN out of the sync (rsync's --exclude syntax; repeatable).")(f)


def script_argument(f):
    return click.argument("script", nargs=-1, type=click.UNPROCESSED)(f)
