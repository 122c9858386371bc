"""Options more than one command takes, defined once."""

from __future__ import annotations

import copy
from pathlib import Path

import click

from labctl.api.inputs import parse_script_args
from labctl.cli.app import CONTEXT
from labctl.spec.labspec import SETTINGS, LabSpec

# Commands that pass everything after their options to the training script.
SCRIPT_CONTEXT = {**CONTEXT, "ignore_unknown_options": True, "allow_interspersed_args": False}


class FilePath(click.Path):
    """click.Path, with a name no file system can hold (a lone surrogate, from undecodable bytes in
    argv) a usage error like any other bad path, where click's own os.stat raises UnicodeEncodeError."""

    def convert(self, value, param, ctx):
        try:
            return super().convert(value, param, ctx)
        except UnicodeEncodeError:
            self.fail(f"{value!r} cannot be a file name on this system", param, ctx)


class TorchrunSpelling(click.Option):
    """An option torchrun has too, taking torchrun's underscore spelling (--nproc_per_node) beside
    labctl's (--nproc-per-node), as torchrun itself does; --help shows labctl's alone."""

    def get_help_record(self, ctx: click.Context):
        shown = copy.copy(self)
        shown.opts = [name for name in self.opts if "_" not in name]
        return click.Option.get_help_record(shown, ctx)


def torchrun_option(name: str, **settings):
    """click.option(NAME, its underscore spelling, ...): e.g. --max-restarts and --max_restarts."""
    dest = name.lstrip("-").replace("-", "_")
    return click.option(name, f"--{dest}", dest, cls=TorchrunSpelling, **settings)


def nproc_option(help_text: str):
    return torchrun_option("--nproc-per-node", metavar="P", help=help_text)


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
    return click.option("--launcher", type=click.Choice(["auto", "warm", "torchrun", "static"]), default="auto",
                        show_default=True,
                        help="warm: each rank forked by its node's fork server, which has torch loaded, with the "
                             "environment torchrun gives a worker (a node without one starts it cold); torchrun: "
                             "an agent per node (c10d rendezvous); static: RANK/WORLD_SIZE/MASTER_ADDR exported, plain "
                             "python. auto: warm, or torchrun for --max-restarts/--nnodes. --dry-run says which and "
                             "why.")(f)


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


def env_options(f):
    """`-e KEY=VALUE` and `--env-file FILE`, as `docker run` takes them (see labctl.run.userenv)."""
    f = click.option("--env-file", "env_files", multiple=True, metavar="FILE",
                     help="Add FILE's KEY=VALUE lines to every process's environment (repeatable; dotenv syntax, "
                          "no ${VAR} expansion).")(f)
    return click.option("-e", "--env", "env_pairs", multiple=True, metavar="KEY[=VALUE]",
                        help="Set KEY in every process's environment (repeatable; over --env-file). KEY alone takes "
                             "its value from labctl's environment, as `docker run -e` does.")(f)


def nccl_debug_option(f):
    """`--nccl-debug`: NCCL_DEBUG=INFO and NCCL_DEBUG_SUBSYS=INIT,NET for every process (labctl.run.userenv)."""
    return click.option("--nccl-debug", is_flag=True,
                        help="Set NCCL_DEBUG=INFO and NCCL_DEBUG_SUBSYS=INIT,NET for every process, so the logs show "
                             "NCCL's transport, interface and GPU choices (-e NCCL_DEBUG=... overrides).")(f)


def _check_script(ctx: click.Context, _param, value: tuple[str, ...]) -> tuple[str, ...]:
    """SCRIPT or -m MODULE first; a labctl option given after `--` is told apart from one the command lacks."""
    if ctx.resilient_parsing:  # shell completion: nothing to check yet
        return value
    known = {name for p in ctx.command.params if isinstance(p, click.Option) for name in p.opts + p.secondary_opts}
    command = " ".join(["labctl", *ctx.command_path.split()[1:]])  # the same under `python -m labctl` and tests
    parse_script_args(list(value), known, command)
    return value


def script_argument(f):
    return click.argument("script", nargs=-1, type=click.UNPROCESSED, callback=_check_script)(f)


def package_options(f):
    """`--requirements FILE` and `--with PKG` (repeatable): the project's packages on every node or host."""
    f = click.option("--with", "with_packages", multiple=True, metavar="PKG[==VERSION]",
                     help="A one-off requirement besides --requirements; repeat for more, e.g. --with tqdm "
                          "--with einops==0.8.1 [env DDPLAB_WITH].")(f)
    return click.option("--requirements", metavar="FILE",
                        help="Your project's packages: a requirements file, a pyproject.toml (pyproject.toml:GROUP for "
                             "one dependency group) or a pylock.toml, resolved once on this machine for the nodes' "
                             "Python into .lab/<lab>/pylock.toml; none for none [env DDPLAB_REQUIREMENTS].")(f)


def package_settings(requirements: str | None, with_packages: tuple[str, ...], cwd) -> dict:
    """The settings `--requirements` and `--with` give (None where not given): a relative FILE is taken
    from where the user stands, as a shell would."""
    if requirements and requirements.strip().lower() not in ("", "none"):
        requirements = str(Path(cwd) / Path(requirements).expanduser())
    return {"requirements": requirements, "with_packages": tuple(with_packages) or None}


def spec_default(name: str) -> str:
    """A setting's default as help text shows it, read off the lab spec's field (None and () are none)."""
    value = LabSpec.__dataclass_fields__[name].default
    return "none" if value in (None, (), "") else str(value)


def spec_help(name: str, text: str, *, note: str = "", default: str | None = None) -> str:
    """An option's help: `text`, then its setting's environment key and default, the default read off
    the lab spec (`default`: in words, where a value would not say it), so the two cannot drift."""
    shown = spec_default(name) if default is None else default
    return f"{text} [env {SETTINGS[name][0]}; default {shown}{'; ' + note if note else ''}]."
