"""The `labctl` group: one Invocation per run of `labctl`, and the one place errors become messages and
exit statuses (never a traceback). Commands live in the modules beside this one, one per group."""

from __future__ import annotations

import atexit
import gc
import importlib
import logging
import os
import sys
from pathlib import Path

import click

from labctl import __version__
from labctl import api
from labctl.api import Lab, docker_client, inventory_hosts
from labctl.core.ui import BuildProgress, error, info
from labctl.core.workspace import find_workspace
from labctl.errors import CommandError, LabError, RunFailed
from labctl.spec.labspec import load_config

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class Invocation:
    """What one `labctl` invocation works with: where the user stands (`cwd`), the workspace (the
    nearest folder from there upwards that holds .lab/, else `cwd`; see labctl.core.workspace), the
    environment, and the Docker client, made at most once and only here."""

    def __init__(self, workspace: Path | None = None, environ=None, cwd: Path | None = None):
        self.cwd = (cwd or Path.cwd()).resolve()
        self.workspace = workspace.resolve() if workspace else find_workspace(self.cwd)
        self.environ = os.environ if environ is None else environ
        self._client = None

    @property
    def client(self):
        if self._client is None:
            self._client = docker_client()
        return self._client

    def config(self, **flags):
        """The configuration: defaults < .env < environment < the flags given (None: not given)."""
        return load_config(self.workspace, self.environ, {k: v for k, v in flags.items() if v is not None})

    def lab(self, name: str | None = None, **settings):
        """The labctl.api.Lab a command works on, reporting progress on stderr."""
        lab = Lab(name, workspace=self.workspace, environ=self.environ, report=info, build_progress=BuildProgress,
                  connect=lambda: self.client, **settings)
        lab.owner_session = "cli"
        return lab

    def here(self) -> api.Workspace:
        """The labctl.api.Workspace of this invocation (what works without a lab up), reporting on stderr;
        imported on this first use (labctl.api's __getattr__), so the lab's commands never load it."""
        return api.Workspace(self.workspace, environ=self.environ, connect=lambda: self.client, report=info)

    def hosts(self, lab: str | None, inventory: str | None, accept_new: bool = False):
        """The labctl.api.Hosts of the inventory given, or of the one `labctl up --ssh` wrote for the lab."""
        return inventory_hosts(self.workspace, self.config(lab=lab, inventory=inventory), accept_new=accept_new,
                               report=info)


def invocation() -> Invocation:
    """The Invocation of the command running now."""
    return click.get_current_context().find_object(Invocation)


# The module that defines each top-level command: loaded when that command runs (click's documented
# lazy-loading pattern), so a command pays only for its own imports. A command missing here is never
# loaded; tests/unit/test_layers.py imports every module of labctl.cli and names what to add.
COMMAND_MODULES = {
    "build": "lab", "up": "lab", "gc": "lab", "status": "lab", "down": "lab", "env": "lab", "logs": "lab", "exec": "lab",
    "ls": "lab", "run": "run",
    "shape": "net", "slow": "net", "fault": "net", "doctor": "diagnose", "scenario": "diagnose",
    "hosts": "hosts", "cost": "bench", "bench": "bench", "slurm": "slurm", "trace": "trace", "k8s": "k8s",
}


def load_all_commands() -> None:
    for module in sorted(set(COMMAND_MODULES.values())):
        importlib.import_module(f"labctl.cli.{module}")


class LabGroup(click.Group):
    """Loads each command's module when it is asked for, and turns the project's errors into one
    clear message and an exit status; never a traceback."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(COMMAND_MODULES) | set(self.commands))

    def get_command(self, ctx: click.Context, name: str):
        if name in COMMAND_MODULES and name not in self.commands:
            importlib.import_module(f"labctl.cli.{COMMAND_MODULES[name]}")
        return super().get_command(ctx, name)

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
        except Exception as exc:
            # The engine answered with an error labctl did not foresee: say what it said, not a traceback.
            if not type(exc).__module__.startswith("docker."):
                raise
            _fail(f"error: the Docker engine refused a request: {exc}", "`docker info` and the engine's log say more; "
                  "`labctl down` removes what a failed command left", 1)


def _fail(message: str, hint: str | None, code: int):
    error(message, hint)
    sys.exit(code)


@click.group(cls=LabGroup, context_settings=CONTEXT)
@click.version_option(__version__, prog_name="labctl")
@click.option("-v", "--verbose", is_flag=True, help="Log every external command labctl runs.")
@click.pass_context
def main(ctx: click.Context, verbose: bool) -> None:
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
    ctx.ensure_object(Invocation)
