"""The lab spec: everything `labctl up`, `Lab(...)` and the pytest marker say a lab is, resolved once
through one precedence (defaults < .env < DDPLAB_* in the environment < arguments: flags or keyword
arguments) into a frozen dataclass, `LabSpec`, that the layers below receive.

Pure: `resolve_config` takes the three sources as plain mappings; only `load_config` reads `.env`.
Every setting has one environment key (DDPLAB_*), listed with a comment in `.env.example`; the
syntax of each is in labctl.spec.parsers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from dotenv import dotenv_values

from labctl.errors import ConfigError, LabError
from labctl.spec.parsers import (
    AUTO,
    MAX_NODES,
    choice,
    int_in,
    matching,
    parse_cpus,
    parse_cuda,
    parse_flag,
    parse_gpus,
    parse_memory,
    parse_memory_limit,
    parse_modules,
    parse_node_cpus,
    parse_requirement_list,
    parse_requirements_file,
    parse_subnet,
)
from labctl.spec.units import format_rate, parse_rate

MAX_NPROC_PER_NODE = 32
# What DDPLAB_CPU_KERNELS=avx2 puts in every node's environment: torch's own kernels (ATen), MKL's
# BLAS (in conditional numerical reproducibility mode) and oneDNN held to AVX2, which every x86-64
# CPU since 2013 has, so a run ends at the same loss and checksum on a host with AVX-512 as on one
# without (the numbers are in docs/explanation/same-numbers.md). `native` lets each pick the
# host's best, as a plain torch does.
CPU_KERNEL_ENV = {"avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
                  "native": {}}


@dataclass(frozen=True, kw_only=True)
class LabSpec:
    lab: str = "ddplab"
    """Lab name: prefixes every container, network and volume, and names `.lab/<lab>/`."""
    nodes: int = 3
    """Number of simulated nodes (containers node0..node{N-1})."""
    nproc_per_node: int = 1
    """Training processes torchrun starts on each node."""
    subnet: str = AUTO
    """IPv4 subnet of the lab's bridge network, or 'auto' to pick a free /24."""
    master_port: int = 29500
    """TCP port of the rendezvous store on node0 (MASTER_PORT)."""
    torch_version: str = "2.13.0"
    """torch release pinned in the node image (CPU build)."""
    base_image: str = "python:3.11-slim-bookworm"
    """Base of the node image; when it cannot be pulled, a local Debian base is built instead."""
    image: str = ""
    """Node image tag; empty means ddplab-node:torch<TORCH_VERSION>-cpu."""
    cpus: float | None = None
    """CPU limit per node (docker --cpus), None for no limit."""
    node_cpus: tuple[tuple[str, float], ...] = ()
    """Per-node CPU limits over `cpus`, as (node, cpus) sorted by node: `up --node-cpus node2=0.25` (a straggler)."""
    memory: str | None = "4g"
    """Memory limit per node (docker --memory, e.g. 512m, 4g), None for no limit."""
    pids_limit: int = 4096
    """Process/thread limit per node (torch starts a thread pool per process)."""
    iface: str = "eth0"
    """Socket interface of the lab network inside a node (GLOO/NCCL_SOCKET_IFNAME)."""
    bw: str | None = None
    """Every node's link rate, shaped at bring-up (`labctl shape --bw` later changes it), e.g. '1gbit'; None: unshaped."""
    ssh: bool | None = None
    """Every node is also an SSH host for `labctl hosts` (`up --ssh`); None: as the running lab is, off for a new one."""
    gpus: str | None = None
    """The machine's GPUs the lab gets: 'all', a count 'N' (the first N) or indices '0,2' ('1,' names GPU 1
    alone); None for none. Nodes take them in order, `gpus_per_node` each (labctl.lab.gpus)."""
    gpus_per_node: int = 1
    """GPUs each GPU node gets: node0 the first K, node1 the next K; nodes beyond the GPUs are CPU nodes."""
    cuda: str = AUTO
    """Nodes that run the CUDA image: 'auto' (exactly the GPU nodes), 'all', the first 'N', or names 'node0,node1'."""
    nccl_transport: str = "socket"
    """'socket': NCCL between GPU nodes goes over the lab's bridge, where `labctl shape` acts on it (P2P, shared
    memory and InfiniBand off); 'auto': NCCL may pick P2P or shared memory between GPUs of this one machine
    (faster, but unshaped)."""
    tcp_cc: str = "cubic"
    """TCP congestion control of the nodes' sockets (cubic, Linux's default, so a lab measures the same on every
    host), or 'host' to keep the host's (labctl.lab.tcp)."""
    cpu_kernels: str = "avx2"
    """'avx2': the nodes' CPU kernels (torch's, MKL's, oneDNN's) held to AVX2, so results are the same on every x86
    host (labctl.spec.labspec.CPU_KERNEL_ENV); 'native': each host's best, results differ between hosts with and without
    AVX-512."""
    warm: str = "auto"
    """Each node's fork server (the warm path: runs start in a second): 'on', 'off', or 'auto', on while the servers
    (about 230 MB each, torch imported) take at most 40% of the engine's memory (labctl.run.warm)."""
    idle_imports: str = "on"
    """What each fork server imports once it is idle, after its preload: 'on' imports torch._dynamo, which a
    script's first optimizer (and torch.compile) needs, so the runs after the first find it imported; 'off' for a
    lab whose runs are few or make no optimizer (a CI lab that runs one job): each node saves 1.4 to 2.4
    CPU-seconds, and a run that needs the module imports it itself (labctl.run.warm)."""
    scheduler: str = "none"
    """'slurm': the nodes are also a Slurm cluster (node0 runs slurmctld, every node slurmd and munged, as root
    in the node; `labctl slurm`); 'none': a plain lab."""
    overlay: str | None = None
    """A mesh VPN between the nodes, over the lab's bridge (labctl.net.overlay): 'tailscale' (tailscale0, addresses
    from 100.64.0.0/10, MTU 1280, as Tailscale makes it), 'wireguard' (wg0, a private /24, MTU 1420) or 'none'; None:
    as the running lab is, none for a new one."""
    torch_index_url: str = "https://download.pytorch.org/whl/cpu"
    """Where the host's pip finds the CPU torch wheel when no local copy exists."""
    debian_mirror: str = ""
    """Debian mirror for the local base image; empty means the one apt uses here."""
    inventory: str = ""
    """The hosts `labctl hosts` drives (a TOML file); empty means .lab/<lab>/hosts.toml (`up --ssh` writes it)."""
    host_python: str = ""
    """The Python that runs the trainer on this machine (bench scaling's host rows); empty means labctl's own."""
    cache_dir: str = ""
    """Where `labctl build` keeps its wheelhouse and build context; empty means the checkout's .lab/, or for an
    installed labctl $XDG_CACHE_HOME/ddplab (~/.cache/ddplab)."""
    requirements: str = ""
    """The project's packages every node gets: a requirements file, a pyproject.toml (`pyproject.toml:GROUP` for a
    dependency group) or a pylock.toml, resolved on the host into the lab's lock (labctl.image.lockfile); empty: none.
    A running lab keeps its packages unless this or `with_packages` is given."""
    with_packages: tuple[str, ...] = ()
    """One-off requirements besides `requirements` (`up --with tqdm --with einops==0.8.1`)."""
    preload: tuple[str, ...] = ()
    """Modules each node's fork server imports besides torch and numpy, so a run's workers find them imported
    (`up --preload lightning`); a running lab keeps its own unless given."""
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    """Where each setting came from ('default', '.env', 'environment', 'flag')."""

    @property
    def image_tag(self) -> str:
        return self.image or f"ddplab-node:torch{self.torch_version}-cpu"

    @property
    def cuda_image_tag(self) -> str:
        """The node image with torch's CUDA build at the same release (Dockerfile.cuda, `build --cuda`)."""
        return cuda_tag(self.torch_version)

    @property
    def node_names(self) -> list[str]:
        return [f"node{i}" for i in range(self.nodes)]

    @property
    def world_size(self) -> int:
        return self.nodes * self.nproc_per_node

    @property
    def memory_bytes(self) -> int | None:
        return None if self.memory is None else parse_memory(self.memory)

    @property
    def node_cpu_limits(self) -> dict[str, float]:
        return dict(self.node_cpus)

    @property
    def node_env(self) -> dict[str, str]:
        """What every node's env file carries from these settings alone (the CPU kernel level)."""
        return {"DDPLAB_CPU_KERNELS": self.cpu_kernels, **CPU_KERNEL_ENV[self.cpu_kernels]}


def cuda_tag(torch_version: str) -> str:
    return f"ddplab-node:torch{torch_version}-cuda"


def _rate(raw: str) -> str:
    """A link rate, in tc's short form ('1gbit'); refusals as `labctl shape --bw` says them."""
    try:
        return format_rate(parse_rate(str(raw).strip()))
    except ConfigError as exc:
        raise ValueError(exc.message.split(": ", 1)[-1] + (f" ({exc.hint})" if exc.hint else "")) from None


def _optional(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """`parse`, or None for an empty value (a setting that may be left unset in .env)."""
    return lambda raw: None if str(raw).strip() == "" else parse(raw)


_LAB_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,30}$")
_IFACE_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,15}$")
_VERSION_RE = re.compile(r"^\d+\.\d+\.\d+$")
_PATH = re.compile(r"^[^\x00]*$")

# setting -> (environment key, parser). The order is the order of .env.example.
SETTINGS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "lab": ("DDPLAB_LAB", matching(_LAB_RE, "must be 1-31 lowercase letters, digits, '-' or '_', starting with a letter or digit")),
    "nodes": ("DDPLAB_NODES", int_in(1, MAX_NODES)),
    "nproc_per_node": ("DDPLAB_NPROC_PER_NODE", int_in(1, MAX_NPROC_PER_NODE)),
    "subnet": ("DDPLAB_SUBNET", parse_subnet),
    # Nodes run as the invoking user, who cannot bind ports below 1024.
    "master_port": ("DDPLAB_MASTER_PORT", int_in(1024, 65535)),
    "torch_version": ("DDPLAB_TORCH_VERSION", matching(_VERSION_RE, "must be a release such as 2.13.0")),
    "base_image": ("DDPLAB_BASE_IMAGE", matching(re.compile(r"^\S+$"), "must be an image reference such as python:3.11-slim-bookworm")),
    "image": ("DDPLAB_IMAGE", matching(re.compile(r"^\S*$"), "must be an image tag without spaces, or empty")),
    "cpus": ("DDPLAB_CPUS", parse_cpus),
    "node_cpus": ("DDPLAB_NODE_CPUS", lambda raw: () if str(raw).strip() == "" else parse_node_cpus(raw)),
    "memory": ("DDPLAB_MEMORY", parse_memory_limit),
    "pids_limit": ("DDPLAB_PIDS_LIMIT", int_in(64, 1_000_000)),
    "iface": ("DDPLAB_IFACE", matching(_IFACE_RE, "must be a network interface name such as eth0 (1-15 characters)")),
    "bw": ("DDPLAB_BW", _optional(_rate)),
    "ssh": ("DDPLAB_SSH", _optional(parse_flag)),
    "gpus": ("DDPLAB_GPUS", parse_gpus),
    "gpus_per_node": ("DDPLAB_GPUS_PER_NODE", int_in(1, 16)),
    "cuda": ("DDPLAB_CUDA", parse_cuda),
    "nccl_transport": ("DDPLAB_NCCL_TRANSPORT", choice("socket", "auto")),
    "tcp_cc": ("DDPLAB_TCP_CC", matching(re.compile(r"^[a-z][a-z0-9_]{0,15}$"),
                                         "must be a congestion control such as cubic, bbr or reno, or 'host'")),
    "cpu_kernels": ("DDPLAB_CPU_KERNELS", choice("avx2", "native")),
    "warm": ("DDPLAB_WARM", choice("auto", "on", "off")),
    "idle_imports": ("DDPLAB_IDLE_IMPORTS", choice("on", "off")),
    "scheduler": ("DDPLAB_SCHEDULER", choice("none", "slurm")),
    "overlay": ("DDPLAB_OVERLAY", _optional(choice("none", "tailscale", "wireguard"))),
    "torch_index_url": ("DDPLAB_TORCH_INDEX_URL", matching(re.compile(r"^(https?|file)://\S+$"), "must be an http(s):// or file:// URL")),
    "debian_mirror": ("DDPLAB_DEBIAN_MIRROR", matching(re.compile(r"^((https?|file)://\S+)?$"), "must be an http(s):// URL or empty")),
    "inventory": ("DDPLAB_INVENTORY", matching(_PATH, "must be a file path, or empty")),
    "host_python": ("DDPLAB_HOST_PYTHON", matching(_PATH, "must be the path of a Python interpreter, or empty")),
    "cache_dir": ("DDPLAB_CACHE_DIR", matching(_PATH, "must be a folder path, or empty")),
    "requirements": ("DDPLAB_REQUIREMENTS", parse_requirements_file),
    "with_packages": ("DDPLAB_WITH", parse_requirement_list),
    "preload": ("DDPLAB_PRELOAD", parse_modules),
}

FLAG_NAMES = {name: "--" + name.replace("_", "-") for name in SETTINGS}
FLAG_NAMES["lab"] = "--lab"
FLAG_NAMES["with_packages"] = "--with"


def resolve_config(
    *,
    dotenv: Mapping[str, str | None] | None = None,
    environ: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
    dotenv_name: str = ".env",
) -> LabSpec:
    """Merge the sources (later wins) and validate every value. Raises ConfigError naming the key."""
    unknown = sorted(set(flags or {}) - set(SETTINGS))
    if unknown:
        raise LabError(f"no setting {unknown[0]!r}", hint=f"the settings: {', '.join(SETTINGS)}")
    layers: list[tuple[str, Mapping[str, Any], bool]] = [
        (dotenv_name, dotenv or {}, False),
        ("environment", environ or {}, False),
        ("flag", {k: setting_text(k, v) for k, v in (flags or {}).items()}, True),
    ]
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name, (key, parse) in SETTINGS.items():
        source, raw = "default", None
        for layer_name, layer, by_field in layers:
            candidate = layer.get(name if by_field else key)
            if candidate is not None:
                source, raw = layer_name, candidate
        if raw is None:
            sources[name] = "default"
            continue
        shown_key = FLAG_NAMES[name] if source == "flag" else key
        try:
            values[name] = parse(raw)
        except ValueError as exc:
            raise ConfigError(shown_key, raw, str(exc), source if source != "flag" else "") from None
        sources[name] = source
    return LabSpec(**values, sources=sources)


def load_config(workspace: Path, environ: Mapping[str, str], flags: Mapping[str, Any]) -> LabSpec:
    """Read `<workspace>/.env` (if any) with python-dotenv and resolve. The only I/O in this module."""
    env_path = workspace / ".env"
    dotenv = dotenv_values(env_path) if env_path.is_file() else {}
    return resolve_config(dotenv=dotenv, environ=environ, flags=flags, dotenv_name=str(env_path))


def check_timeout(timeout_s: float | None) -> None:
    if timeout_s is not None and timeout_s <= 0:
        raise ConfigError("--timeout-s", timeout_s, "must be a positive number of seconds")


def given_settings(lab: str | None, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The settings a caller gave, `lab` among them: those that are None were not given."""
    return {key: value for key, value in {"lab": lab, **settings}.items() if value is not None}


def check_nproc(value: int | str | None) -> int | None:
    """--nproc-per-node, checked by the same rule as DDPLAB_NPROC_PER_NODE; None when not given."""
    if value is None:
        return None
    try:
        return SETTINGS["nproc_per_node"][1](str(value))
    except ValueError as exc:
        raise ConfigError("--nproc-per-node", value, str(exc)) from None


def shown_key(config: LabSpec, name: str) -> str:
    """How to name a setting in an error: the flag if it came from one, else its environment key."""
    return FLAG_NAMES[name] if config.sources.get(name) == "flag" else SETTINGS[name][0]


def shown_source(config: LabSpec, name: str) -> str:
    source = config.sources.get(name, "")
    return "" if source == "flag" else source


def parse_cpu_limit(raw: str, key: str, hint: str | None = None) -> float:
    """A CPU limit a flag sets (`slow --cpus`, `bench straggler --cpus`): a number, never "none"."""
    try:
        limit = parse_cpus(raw)
    except ValueError as exc:
        raise ConfigError(key, raw, str(exc)) from None
    if limit is None:
        raise ConfigError(key, raw, "must be a CPU count such as 0.25", hint=hint)
    return limit


def checked_node_cpus(text: str, nodes: int, key: str = "--node-cpus") -> dict[str, float]:
    """'node2=0.25,node0=1' -> {'node0': 1.0, 'node2': 0.25}: per-node CPU limits for stragglers, on
    a lab of `nodes` nodes."""
    try:
        limits = parse_node_cpus(text)
    except ValueError as exc:
        raise ConfigError(key, text, str(exc)) from None
    return check_node_cpus(limits, nodes, key, text)


def check_node_cpus(limits: tuple[tuple[str, float], ...] | Mapping[str, float], nodes: int,
                    key: str = "--node-cpus", given: object = None) -> dict[str, float]:
    """Per-node CPU limits that name only nodes a lab of `nodes` nodes has."""
    limits = dict(limits)
    beyond = [name for name in limits if int(name[4:]) >= nodes]
    if beyond:
        shown = given if given is not None else ",".join(f"{n}={c:g}" for n, c in limits.items())
        raise ConfigError(key, shown, f"names {beyond[0]}, but the lab has node0..node{nodes - 1}")
    return limits


def setting_text(name: str, value: Any) -> Any:
    """A keyword argument as its setting spells it, for the parsers: {'node2': 0.25} is 'node2=0.25',
    GPU indices [1] are '1,' (GPU 1, not one GPU), requirements one per line, node names ['node0'] 'node0', 3 is '3'."""
    if isinstance(value, Mapping):
        return ",".join(f"{k}={v}" for k, v in value.items())
    if isinstance(value, (list, tuple)) and name == "with_packages":  # a requirement may hold commas
        return "\n".join(map(str, value))
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value)) + ("," if name == "gpus" and len(value) == 1 else "")
    return str(value)


def parse_nodes_list(raw: str, key: str = "--nodes-list") -> list[int]:
    """'3,16' -> [3, 16]: lab sizes for the benchmarks, each checked by the rule --nodes follows."""
    parse = SETTINGS["nodes"][1]
    try:
        values = [parse(part) for part in raw.split(",") if part.strip()]
    except ValueError as exc:
        raise ConfigError(key, raw, f"each count {exc}") from None
    if not values:
        raise ConfigError(key, raw, "must list node counts, comma-separated, e.g. 3,16")
    return values
