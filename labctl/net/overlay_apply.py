"""The overlay on the engine: its helper image, the lab's WireGuard keys, one helper per node running
wireguard-go in the node's network namespace, and the tunnels read back. The side-effect half of
overlay.py.

Each node's helper (`<lab>-overlay-<node>`) is the one container of the lab with /dev/net/tun, and
has NET_ADMIN besides, as Tailscale's sidecar has; the node has neither. It carries the lab's label,
so `down` and `gc` remove it with the lab, and it is started again where its node was (a restarted
node has a new namespace, which the old tunnel is not in).

The keys are made per lab, once, by `wg genkey` in a container of the helper image with no network,
and kept in .lab/<lab>/overlay/keys.json (mode 0600, its folder 0700): a node keeps its key while the
lab lives, as a Tailscale machine keeps its node key. Each private key reaches its node's helper as
a file (put_archive, mode 0600, on the container's own layer) and nowhere else: no env file, no
image, no log. `down` and `gc` remove the folder (labctl.lab.lifecycle.forget_secrets).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from labctl.core.assets import overlay_dockerfile
from labctl.core.ui import Report
from labctl.engine.docker import exec_in
from labctl.engine.labels import container_name
from labctl.errors import LabError, StateError
from labctl.image.base import LOCAL_BASE, ensure_base, image_exists
from labctl.image.builder import BuildSource, NullProgress, docker_build
from labctl.lab.lifecycle import OVERLAY_KEYS_DIR
from labctl.net import overlay as ov
from labctl.net.apply import helper_name, helper_script, kept_helper, lab_helpers
from labctl.spec.labspec import LabSpec

ROLE = "overlay"  # the role label of a node's overlay helper
LABEL_IFACE = "io.ddplab.overlay-iface"  # on a helper: the tunnel it makes (tailscale0, wg0)
KEYS_FILE = "keys.json"
TUN = "/dev/net/tun"
TUN_MISSING = "no such file"  # the engine's answer when the device it is to add does not exist


def image_tag(base: str) -> str:
    """The helper image's tag: a hash of its Dockerfile and the base it is built FROM."""
    digest = hashlib.sha256(overlay_dockerfile().read_bytes() + base.encode()).hexdigest()[:12]
    return f"ddplab-overlay:{digest}"


def helper_base(client, config: LabSpec, report: Report) -> str:
    """What the helper image is built FROM: the base the node image stands on, as `labctl build` found it
    (the configured base where it is here, else the local Debian one, made where missing)."""
    for tag in (config.base_image, LOCAL_BASE):
        if image_exists(client, tag):
            return tag
    return ensure_base(client, config, report)


def ensure_image(client, base: str, report: Report) -> str:
    """The helper image, built once from the base the nodes' image stands on (a few MB more)."""
    tag = image_tag(base)
    if image_exists(client, tag):
        return tag
    report(f"overlay: building {tag} (wireguard-go and wireguard-tools from Debian, on {base})")
    context = overlay_dockerfile().parent
    docker_build(client, tag, BuildSource(dockerfile="Dockerfile", build_args={"BASE": base}, context=str(context)),
                 labels={"io.ddplab.role": ROLE}, progress=NullProgress())
    return tag


def check_tun(client, image: str) -> None:
    """Refuse, before anything starts, an engine whose machine has no TUN device for wireguard-go."""
    import docker.errors

    try:
        client.containers.run(image, ["test", "-c", TUN], devices=[f"{TUN}:{TUN}"], network_mode="none",
                              remove=True, entrypoint=[])
    except (docker.errors.APIError, docker.errors.ContainerError) as exc:
        said = str(exc)
        if TUN_MISSING in said or isinstance(exc, docker.errors.ContainerError):
            raise StateError(f"the engine's machine has no TUN device ({TUN}), which the overlay's wireguard-go needs; "
                             "nothing was started",
                             hint="load the tun module (`modprobe tun`) on the engine's machine, or leave --overlay out") \
                from None
        raise


def keys_dir(directory: Path) -> Path:
    return directory / OVERLAY_KEYS_DIR


def ensure_keys(client, image: str, directory: Path, names: list[str]) -> dict[str, tuple[str, str]]:
    """Each node's (private, public) key, made once per lab and kept in .lab/<lab>/overlay/keys.json;
    a node the lab did not have before gets a new pair, a node it no longer has loses its own."""
    path = keys_dir(directory) / KEYS_FILE
    kept = json.loads(path.read_text()) if path.is_file() else {}
    missing = [n for n in names if n not in kept]
    if missing:
        output = client.containers.run(image, ["sh", "-c", ov.GENKEY_SCRIPT, "genkey", str(len(missing))],
                                       network_mode="none", remove=True, entrypoint=[]).decode()
        kept.update(zip(missing, map(list, ov.parse_keys(output, len(missing)))))
    keys = {n: (kept[n][0], kept[n][1]) for n in names}
    write_secret(path, json.dumps({n: list(pair) for n, pair in keys.items()}, indent=1) + "\n")
    return keys


def write_secret(path: Path, text: str) -> None:
    """`text` in `path`, readable by its owner alone (mode 0600, in a 0700 folder), from the start."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path.parent, 0o700)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as stream:
        stream.write(text)
    os.replace(tmp, path)


def node_helper(client, lab: str, node: str, overlay: ov.Overlay, image: str):
    """The node's overlay helper in the namespace the node has now (else a new one): wireguard-go
    making `overlay.iface`, the lab's only container with the TUN device."""
    return kept_helper(client, lab, node, ROLE, ov.helper_argv(overlay), image, {LABEL_IFACE: overlay.iface},
                       devices=[f"{TUN}:{TUN}"], environment=ov.USERSPACE_ENV)


def secret_tar(path: str, text: str) -> bytes:
    """A tar of one file at `path` (relative to /), mode 0600, for put_archive."""
    data = text.encode()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo(path.lstrip("/"))
        info.size, info.mode = len(data), 0o600
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def apply_overlay(client, lab: str, overlay: ov.Overlay, image: str, keys: dict[str, tuple[str, str]],
                  bridge_ips: dict[str, str]) -> dict[str, str]:
    """Every node's tunnel up, with every other node as its peer: node -> its overlay address."""
    names = list(bridge_ips)
    overlay_ips = ov.addresses(overlay, names)
    public = {n: keys[n][1] for n in names}

    def one(node: str) -> tuple[str, int, str]:
        helper = node_helper(client, lab, node, overlay, image)
        text = ov.build_config(overlay, node, keys[node][0], public, overlay_ips, bridge_ips)
        helper.put_archive("/", secret_tar(ov.config_path(overlay), text))
        code, said = exec_in(client, helper.id, ["sh", "-c", helper_script(ov.build_up(overlay, overlay_ips[node]))])
        return node, code, said

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(one, names))
    failed = [(node, said) for node, code, said in results if code != 0]
    if failed:
        node, said = failed[0]
        raise LabError(f"{node}: its {overlay.iface} did not come up: {said.strip()[-300:]}",
                       hint=f"docker logs {helper_name(lab, node, ROLE)}")
    return overlay_ips


def running_kind(client, lab: str) -> str:
    """The overlay a running lab has: the kind its helpers make, `none` without any."""
    for helper in lab_helpers(client, lab, ROLE):
        iface = (helper.get("Labels") or {}).get(LABEL_IFACE)
        for kind, overlay in ov.OVERLAYS.items():
            if iface == overlay.iface:
                return kind
    return ov.NONE


def running_overlay(client, lab: str, subnet: str | None) -> ov.Overlay | None:
    """The overlay of a running lab on `subnet` (the bridge's: plain WireGuard's range steps around
    it), as its helpers make it; None without one."""
    kind = running_kind(client, lab)
    return ov.overlay_for(kind, subnet) if subnet and kind != ov.NONE else None


@dataclass(frozen=True)
class OverlayState:
    """A lab's overlay as its nodes have it: the kind, the tunnel and each node's address on it (None
    where the node has no tunnel up)."""

    kind: str
    iface: str
    mtu: int
    addresses: dict[str, str | None]

    def as_dict(self) -> dict:
        return {"kind": self.kind, "iface": self.iface, "mtu": self.mtu, "addresses": self.addresses}


def read_overlay(client, lab: str, names: list[str]) -> OverlayState | None:
    """The running lab's overlay, each node's address read inside the node (`ip address`, no
    capability needed); None where the lab has no overlay."""
    kind = running_kind(client, lab)
    if kind == ov.NONE:
        return None
    overlay = ov.OVERLAYS[kind]
    argv = ["ip", "-o", "-4", "address", "show", "dev", overlay.iface]

    def one(node: str) -> str | None:
        code, said = exec_in(client, container_name(lab, node), argv)
        return ov.parse_iface_address(said) if code == 0 else None

    with ThreadPoolExecutor(max_workers=8) as pool:
        found = dict(zip(names, pool.map(one, names)))
    return OverlayState(kind, overlay.iface, overlay.mtu, found)
