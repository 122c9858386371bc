"""The package image: the node image with the lab's lock installed, one layer on top, keyed by the
lock's hash. Every node of a lab runs it, so every node has the same bytes; a second `up` with the
same lock finds it and builds nothing.

Made without a Dockerfile: a container of the node image, with no network, is given the wheels the
node lacks (what its own Python reports, compared with the lock: labctl.image.packages.to_install),
installs them with pip in hash-checking mode from that folder alone (`--no-index --no-deps
--require-hashes`), removes the folder, and is committed as `<node image>-pkgs-<hash12>`. The layer
holds the installed files and nothing else: no wheel, no cache. A `docker build` would keep the
wheels in a COPY layer (the classic builder has no `RUN --mount`).

The image is labelled with the lock's digest and the id of the node image it was made on: a new
node image (a trainer change, another torch) makes the package image again, under the same tag.
"""

from __future__ import annotations

import io
import tarfile
import time
from pathlib import Path

from labctl import remote
from labctl.core import assets
from labctl.core.proc import last_json_line
from labctl.core.ui import Report
from labctl.errors import LabError
from labctl.image.base import TARGET_CACHE, find_image, node_target
from labctl.image.builder import remove_replaced
from labctl.image.lockfile import Lock, hash_requirements, render_lock, to_install
from labctl.image.packages import LABEL_PACKAGES, LABEL_PACKAGES_BASE, Declaration, package_tag
from labctl.image.resolve import ensure_lock, fetch_wheels
from labctl.image.wheelhouse import Target
from labctl.spec.labspec import LabSpec

INSTALL_DIR = "/tmp/ddplab-packages"
INFO_SCRIPT = remote.load("node_info.py")


def installed_packages(container) -> dict[str, str]:
    """{name: version} of every distribution the container's Python sees (node_info.py's report)."""
    code, output = container.exec_run(["python", "-c", INFO_SCRIPT], user="0:0")
    text = output.decode(errors="replace")
    report = last_json_line(text)
    if code != 0 or report is None:
        raise LabError(f"the node image's Python did not list its packages (exit {code}): {text[-300:]}")
    return report["packages"]


def wheels_tar(paths: list[Path], requirements: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        folder = tarfile.TarInfo(INSTALL_DIR.rsplit("/", 1)[-1])
        folder.type, folder.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(folder)
        for path in paths:
            tar.add(path, arcname=f"{folder.name}/{path.name}", recursive=False)
        data = requirements.encode()
        info = tarfile.TarInfo(f"{folder.name}/requirements.txt")
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def install_argv() -> list[str]:
    return ["python", "-m", "pip", "install", "--no-index", "--no-deps", "--require-hashes", "--no-cache-dir",
            "--disable-pip-version-check", "--find-links", INSTALL_DIR, "-r", f"{INSTALL_DIR}/requirements.txt"]


def ensure_package_image(client, base: str, lock: Lock, cache: Path, target: Target, report: Report) -> str:
    """The package image for `lock` on the node image `base`: found, or made now. Returns its tag."""
    base_image = find_image(client, base)
    if base_image is None:
        raise LabError(f"no node image {base} to install the packages on", hint="`labctl build` makes it")
    tag = package_tag(base, lock.digest)
    existing = find_image(client, tag)
    labels = (existing.labels or {}) if existing is not None else {}
    if labels.get(LABEL_PACKAGES) == lock.digest and labels.get(LABEL_PACKAGES_BASE) == base_image.id:
        return tag
    started = time.monotonic()
    container = client.containers.create(base, ["sleep", "infinity"], user="0:0", network_disabled=True)
    try:
        container.start()
        pins = to_install(lock, installed_packages(container))
        if pins:
            report(f"packages: installing {len(pins)} of the lock's {len(lock.pins)} packages on {base} "
                   f"(the image has the rest)")
            paths = fetch_wheels(pins, cache, target, report)
            container.put_archive("/tmp", wheels_tar(paths, hash_requirements(pins)))
            code, output = container.exec_run(install_argv(), user="0:0")
            if code != 0:
                tail = "\n    ".join(output.decode(errors="replace").strip().splitlines()[-12:])
                raise LabError(f"pip could not install the lock's wheels on {base} (exit {code}):\n    {tail}")
            container.exec_run(["rm", "-rf", INSTALL_DIR], user="0:0")
        container.kill()
        repository, _, name = tag.rpartition(":")
        made = container.commit(repository=repository, tag=name,
                                changes=[f"LABEL {LABEL_PACKAGES}={lock.digest}",
                                         f"LABEL {LABEL_PACKAGES_BASE}={base_image.id}"])
    finally:
        container.remove(force=True)
    report(f"packages: image {tag} made in {time.monotonic() - started:.1f} s")
    remove_replaced(client, existing.id if existing is not None else None, made.id, tag, report)
    return tag


def package_images(client, lock: Lock, bases: set[str], cache: Path, target: Target, report: Report) -> dict[str, str]:
    """{node image: its package image} for every node image a lab runs."""
    return {base: ensure_package_image(client, base, lock, cache, target, report) for base in sorted(bases)}


def lock_and_layer(client, declaration: Declaration, config: LabSpec, bases: set[str],
                   report: Report) -> tuple[Lock, dict[str, str], str]:
    """The lab's packages for nodes on the node images `bases`: their lock, resolved (or found), the
    package image of every node image ({node image: its package image}, made now where missing), and
    the lock's text as the lab's pylock.toml says it."""
    cache = assets.cache_dir(config.cache_dir)
    target = node_target(client, config.image_tag if config.image_tag in bases else min(bases), report,
                         cache / TARGET_CACHE)
    node_wheels = assets.wheelhouse(assets.build_context(config.cache_dir))
    lock = ensure_lock(declaration, torch=config.torch_version, target=target, cache=cache, report=report,
                       find_links=[node_wheels], torch_index_url=config.torch_index_url)
    images = package_images(client, lock, bases, cache, target, report)
    return lock, images, render_lock(lock, target)
