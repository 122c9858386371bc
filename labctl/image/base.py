"""The base image the node images are built FROM, and its Python.

The configured BASE_IMAGE (the official Python image) where it is local or can be pulled; otherwise
a local Debian base: debootstrap from the apt mirror this machine already uses, then `docker import`,
built once. The node's Python (interpreter and platform) is asked of the base image itself, and
decides which wheels the wheelhouse gets (labctl/image/wheelhouse.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from labctl.core.proc import run
from labctl.core.ui import Report
from labctl.errors import CommandError, LabError
from labctl.image.wheelhouse import Target, target_from_probe
from labctl.spec.labspec import LabSpec


TARGET_CACHE = "node-python.json"  # in the cache folder: the base image's Python, by base image id
TARGET_PROBE = Path(__file__).resolve().parents[1] / "remote" / "python_target.py"
# g++ and python3-dev: torch.compile's CPU backend (inductor) writes C++ and builds it against the
# Python headers, as on any machine that develops with torch (the Dockerfile says the same).
BASE_PACKAGES = ("python3,python3-venv,python3-pip,python3-dev,g++,iproute2,iperf3,procps,util-linux,ca-certificates,"
                 "openssh-server,rsync,libnss-wrapper,slurmd,slurmctld,slurm-client,munge")
# The local base's tag names its package list, so a base made before the list changed is not reused.
LOCAL_BASE = f"ddplab-base:bookworm-{hashlib.sha256(BASE_PACKAGES.encode()).hexdigest()[:8]}"


# --------------------------------------------------------------------------------------- pure


def debian_mirror_from_apt(sources_dir: Path = Path("/etc/apt")) -> str:
    """The Debian mirror apt uses here: the route to packages that is known to work on this machine."""
    candidates: list[Path] = [sources_dir / "sources.list"]
    candidates += sorted((sources_dir / "sources.list.d").glob("*")) if (sources_dir / "sources.list.d").is_dir() else []
    for path in candidates:
        try:
            text = path.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            line = line.strip()
            uris = []
            if line.startswith("URIs:"):
                uris = line.split()[1:]
            elif line.startswith("deb ") and "bookworm" in line:
                uris = [w for w in line.split() if "://" in w]
            for uri in uris:
                if uri.rstrip("/").endswith("/debian"):
                    return uri
    return "http://deb.debian.org/debian"


# ------------------------------------------------------------------------------ side effects


def node_target(client, image: str, report: Report, cache: Path) -> Target:
    """The interpreter and platform of an image's python3, asked of the image itself (half a
    second, once per image: answers are kept by image id)."""
    image_id = client.images.get(image).id
    try:
        known = json.loads(cache.read_text())
    except (OSError, ValueError):
        known = {}
    if isinstance(known.get(image_id), dict):
        try:
            return Target(**known[image_id])
        except TypeError:
            pass
    report(f"image: asking {image} which Python it has")
    output = client.containers.run(image, ["python3", "-c", TARGET_PROBE.read_text()], entrypoint=[], remove=True,
                                   network_disabled=True, user="0:0").decode(errors="replace")
    try:
        target = target_from_probe(json.loads(output.strip().splitlines()[-1]))
    except (ValueError, IndexError, KeyError):
        raise LabError(f"{image} did not say which Python it has: {output[:300]!r}",
                       hint="the base image needs python3 on its PATH (DDPLAB_BASE_IMAGE)") from None
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({**known, image_id: dataclasses.asdict(target)}, indent=1) + "\n")
    return target


def image_exists(client, tag: str) -> bool:
    return find_image(client, tag) is not None


def find_image(client, tag: str):
    """The image `tag` names (a docker Image: id, labels, tags), or None where there is none."""
    import docker.errors

    try:
        return client.images.get(tag)
    except docker.errors.ImageNotFound:
        return None


def ensure_base(client, config: LabSpec, report: Report) -> str:
    """The base image to build FROM: the configured one if we have or can pull it, else a local one."""
    import docker.errors

    if image_exists(client, config.base_image):
        return config.base_image
    report(f"base: pulling {config.base_image}")
    try:
        client.images.pull(config.base_image)
        return config.base_image
    except docker.errors.APIError as exc:
        reason = str(exc.explanation or exc).splitlines()[0][:160]
        report(f"base: cannot pull {config.base_image} ({reason}); using a local Debian base instead")
    if not image_exists(client, LOCAL_BASE):
        build_local_base(config, report)
    return LOCAL_BASE


def build_local_base(config: LabSpec, report: Report) -> None:
    """debootstrap a minimal bookworm with Python 3.11 and import it as an image (about a minute)."""
    if os.geteuid() != 0:
        raise LabError(f"cannot pull {config.base_image} and building a local base needs root (debootstrap)",
                       hint="make the base image available (docker pull or docker load), or run as root")
    if shutil.which("debootstrap") is None:
        report("base: installing debootstrap")
        run(["apt-get", "install", "-y", "-qq", "debootstrap"], check=False)
        if shutil.which("debootstrap") is None:
            run(["apt-get", "update", "-qq"])
            run(["apt-get", "install", "-y", "-qq", "debootstrap"])
    mirror = config.debian_mirror or debian_mirror_from_apt()
    report(f"base: debootstrap bookworm from {mirror} (about a minute, once)")
    with tempfile.TemporaryDirectory(prefix="ddplab-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        run(["debootstrap", "--variant=minbase", f"--include={BASE_PACKAGES}", "bookworm", str(rootfs), mirror])
        # openssh-server's install made host keys: no image layer may carry them (nodes make their own).
        for key in (rootfs / "etc" / "ssh").glob("ssh_host_*"):
            key.unlink()
        report(f"base: importing as {LOCAL_BASE}")
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        try:
            run_import = subprocess.run(["docker", "import", "-c", "ENV LANG=C.UTF-8", "-", LOCAL_BASE],
                                        stdin=tar.stdout, capture_output=True, text=True)
        finally:
            tar.stdout.close()
            tar.wait()
        if run_import.returncode != 0:
            raise CommandError(["docker", "import", "-", LOCAL_BASE], run_import.returncode, run_import.stdout, run_import.stderr)
