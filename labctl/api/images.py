"""What works without a lab: the node images (`labctl build`) and the env files for real machines
(`labctl env`)."""

from __future__ import annotations

from pathlib import Path

from labctl.core.ui import Report
from labctl.image import image as image_mod
from labctl.image.image import BuildInputs, build_images
from labctl.lab.envfiles import check_rdzv_id, parse_hosts, write_host_env_files
from labctl.spec.labspec import LabSpec


__all__ = ["build_images", "image_inputs", "write_host_env"]


def image_inputs(client, config: LabSpec, report: Report, *, cuda: bool = False) -> tuple[str, BuildInputs, str | None]:
    """`labctl build --print-hash`: (the image's tag, the inputs it would be built from and their
    hash, the hash the existing image was built with or None); builds nothing."""
    tag = image_mod.image_tag(config, cuda)
    inputs = image_mod.gather_inputs(client, config, report, cuda=cuda)
    return tag, inputs, image_mod.image_hash(client, tag)


def write_host_env(hosts: str, config: LabSpec, rdzv_id: str,
                   out_dir: Path) -> tuple[tuple[str, ...], list[Path], list[tuple[str, str, str]]]:
    """`labctl env`: `hosts` ("10.0.0.1,10.0.0.2", the first node 0) checked, and every machine's env
    file written to `out_dir`; (the addresses, the paths, and (node, host, the command to paste
    there) for each). ConfigError (exit 2) for a bad address or rendezvous id, before anything is written."""
    addresses = parse_hosts(hosts)
    check_rdzv_id(rdzv_id)
    paths, commands = write_host_env_files(addresses, config, rdzv_id, out_dir)
    return addresses, paths, commands
