"""This workspace on this engine: what works without a lab being up, as one object of the API, as
`Lab` is for a lab: the node images (`labctl build`) and the env files for real machines (`env`), every lab on the engine (`ls`) and the ones
that may go (`gc`), the benches that bring up labs of their own (`bench up`, `bench start`) and the
traps reproduced on labs of their own (`scenario run`).

    from labctl.api import Workspace

    here = Workspace()                        # the current folder; the engine asked at first need
    for what, built in here.build_images(here.spec()):
        print(what, built.tag, built.cached)
    print([listing.lab for listing in here.labs()])
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from labctl.api.scenarios import ScenarioOutcome, run_scenarios
from labctl.bench.bringup import UpTiming, bench_up
from labctl.bench.startup import StartReport
from labctl.bench.startup import measure as bench_start
from labctl.core.ui import Report
from labctl.engine.docker import docker_client
from labctl.image.image import BuildInputs, BuildResult, build_images, gather_inputs, image_hash, image_tag
from labctl.lab.envfiles import check_rdzv_id, parse_hosts, write_host_env_files
from labctl.lab.garbage import ImageVerdict, LabVerdict, collect_garbage, collect_package_images
from labctl.lab.listing import LabListing, list_labs
from labctl.net.apply import link_text
from labctl.spec.labspec import LabSpec, given_settings, load_config

__all__ = ["Workspace"]


def _quiet(_message: str) -> None:
    pass


class Workspace:
    """The workspace `path` (default: the current folder) and the engine `client` talks to (else
    `connect`, default the environment's engine, makes one at first need). `report` receives progress
    lines; `environ` (default this process's) holds the DDPLAB_* settings a spec resolves from."""

    def __init__(self, path: str | Path | None = None, *, environ: Mapping[str, str] | None = None, client=None,
                 connect: Callable | None = None, report: Report | None = None):
        self.path = Path(path or Path.cwd()).resolve()
        self.environ = os.environ if environ is None else environ
        self.report = report or _quiet
        self._client = client
        self._connect = connect or docker_client

    @property
    def client(self):
        if self._client is None:
            self._client = self._connect()
        return self._client

    def spec(self, name: str | None = None, **settings: Any) -> LabSpec:
        """The lab spec `Lab(name, **settings)` and `labctl up` work from, resolved here: defaults, then
        the workspace's `.env`, then DDPLAB_* in `environ`, then `settings` (LabSpec's fields as `labctl
        up` takes them; None: not given)."""
        return load_config(self.path, self.environ, given_settings(name, settings))

    # ------------------------------------------------------------------------------- images

    def build_images(self, spec: LabSpec, progress=None, *, force: bool = False, cuda: bool = False,
                     mismatch: bool = False, lean: bool = False) -> Iterator[tuple[str, BuildResult]]:
        """`labctl build`: the node image of `spec` (the CUDA one with `cuda`), then with `mismatch` the
        version-mismatch scenario's; (what it is, its BuildResult) as each is done. `progress` makes
        a progress bar for a build step."""
        return build_images(self.client, spec, self.report, progress, force=force, cuda=cuda, mismatch=mismatch,
                            lean=lean)

    def image_inputs(self, spec: LabSpec, *, cuda: bool = False) -> tuple[str, BuildInputs, str | None]:
        """`labctl build --print-hash`: (the image's tag, the inputs it would be built from and their
        hash, the hash the existing image was built with or None); builds nothing."""
        tag = image_tag(spec, cuda)
        return tag, gather_inputs(self.client, spec, self.report, cuda=cuda), image_hash(self.client, tag)

    def write_host_env(self, hosts: str, spec: LabSpec, rdzv_id: str,
                       out_dir: Path) -> tuple[tuple[str, ...], list[Path], list[tuple[str, str, str]]]:
        """`labctl env`: `hosts` ("10.0.0.1,10.0.0.2", the first node 0) checked, and every machine's env
        file written to `out_dir`; (the addresses, the paths, and (node, host, the command to paste
        there) for each). ConfigError (exit 2) for a bad address or rendezvous id, before anything is
        written."""
        addresses = parse_hosts(hosts)
        check_rdzv_id(rdzv_id)
        paths, commands = write_host_env_files(addresses, spec, rdzv_id, out_dir)
        return addresses, paths, commands

    # --------------------------------------------------------------------------------- labs

    def labs(self) -> list[LabListing]:
        """Every lab on the engine, whoever brought it up, its running nodes' links read back (`labctl ls`)."""
        return list_labs(self.client, functools.partial(link_text, self.client))

    def gc(self, *, everything: bool = False, dry_run: bool = False) -> tuple[list[LabVerdict], list[ImageVerdict]]:
        """`labctl gc`: the labs whose owner process is gone removed (every lab with `everything`), then
        the package images no lab's node runs any more; a verdict for each (with `dry_run`: would be)."""
        labs = collect_garbage(self.client, everything=everything, dry_run=dry_run)
        going = [verdict.lab for verdict in labs if verdict.remove]
        return labs, collect_package_images(self.client, dry_run=dry_run, going=going)

    # ----------------------------------------------------------------- labs of their own

    def bench_up(self, nodes_list: list[int], repeats: int, packages: list[str] | None = None) -> list[UpTiming]:
        """`labctl bench up`: `labctl up --nodes N` against a raw `docker compose up -d`, alternated."""
        return bench_up(self.client, self.path, nodes_list, repeats, self.report, packages=packages)

    def bench_start(self, nodes: int = 3, rounds: int = 5, torchx: str | None = None,
                    up_args: list[str] | None = None, preload: tuple[str, ...] = ()) -> StartReport:
        """`labctl bench start`: what a run costs from the shell to its last process's exit, every way."""
        return bench_start(self.client, self.path, nodes, rounds, torchx, self.report, up_args, preload)

    def scenarios(self, names: list[str], show: Callable[[ScenarioOutcome], None] | None = None,
                  overlay: str | None = None) -> list[ScenarioOutcome]:
        """`labctl scenario run`: each trap in `names` on a 2-node lab of its own, on the network it
        needs or `overlay`; `show` gets each outcome as soon as it is known."""
        return run_scenarios(self.client, self.spec, self.path, names, self.report, show, overlay)
