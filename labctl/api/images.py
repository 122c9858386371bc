"""What works without a lab: the node images (`labctl build`) and the env files for real machines
(`labctl env`), as functions of the client; the same are methods of labctl.api.Workspace."""

from __future__ import annotations

from pathlib import Path

from labctl.api.workspace import Workspace
from labctl.core.ui import Report
from labctl.image.image import BuildInputs, build_images
from labctl.spec.labspec import LabSpec


__all__ = ["build_images", "image_inputs", "write_host_env"]


def image_inputs(client, config: LabSpec, report: Report, *, cuda: bool = False) -> tuple[str, BuildInputs, str | None]:
    """`labctl build --print-hash` (Workspace.image_inputs): the image's tag, the inputs it would be
    built from and their hash, the hash the existing image was built with or None; builds nothing."""
    return Workspace(client=client, report=report).image_inputs(config, cuda=cuda)


def write_host_env(hosts: str, config: LabSpec, rdzv_id: str,
                   out_dir: Path) -> tuple[tuple[str, ...], list[Path], list[tuple[str, str, str]]]:
    """`labctl env` (Workspace.write_host_env): every machine's env file written to `out_dir`."""
    return Workspace().write_host_env(hosts, config, rdzv_id, out_dir)
