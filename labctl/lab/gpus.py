"""GPU nodes: which of the machine's GPUs each node gets, which nodes run the CUDA image, and what
their env files say about it.

Pure, but for `detect_gpus`: `build_gpu_plan`, which turns the settings, the lab's
nodes and the machine's GPUs (as nvidia-smi lists them) into each node's GPUs, image and env
additions, or raises what is wrong. `detect_gpus` asks nvidia-smi (never torch: it is cheap and
this machine's Python need not have torch); labctl.lab.up puts them together with the engine's
runtime check (labctl.engine.detect.gpu_runtime_refusal).

Two rules the env files carry:
- gloo and NCCL cannot mix in one process group: a lab whose every node has a GPU trains with
  NCCL (DDPLAB_BACKEND=nccl on every node), a lab that mixes GPU and CPU nodes with gloo on all of
  them (DDPLAB_BACKEND=gloo); a lab without GPUs leaves the choice to the trainer.
- `nccl_transport=socket` (the default) turns NCCL's P2P, shared-memory and InfiniBand transports
  off on GPU nodes: two nodes' GPUs sit in one machine here, and NCCL would otherwise move their
  traffic through the GPUs or host memory, past the lab's bridge network, where `labctl shape`
  (tc) cannot slow it. `auto` lets NCCL pick: faster, but the links a lab simulates are then not
  the links NCCL uses.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

from labctl.errors import ConfigError, StateError
from labctl.spec.labspec import LabSpec, shown_key, shown_source
from labctl.spec.parsers import AUTO

SOCKET_ONLY = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_IB_DISABLE": "1"}
NO_GPU_HINT = ("leave --gpus out: `--cuda N` runs the CUDA image on CPU nodes (gloo); on a machine with an NVIDIA GPU, "
               "install its driver and the NVIDIA Container Toolkit")


@dataclass(frozen=True)
class Gpu:
    """One GPU as nvidia-smi lists it."""

    index: int
    name: str
    uuid: str


@dataclass(frozen=True)
class NodeGpus:
    node: str
    gpus: tuple[int, ...]  # the machine's GPU indices the node gets (empty: a CPU node)
    cuda: bool  # runs the CUDA image
    image: str
    env: Mapping[str, str] = field(default_factory=dict)  # added to the node's env file


@dataclass(frozen=True)
class GpuPlan:
    nodes: tuple[NodeGpus, ...]

    def node(self, name: str) -> NodeGpus | None:
        return next((n for n in self.nodes if n.node == name), None)

    @property
    def gpu_nodes(self) -> list[str]:
        return [n.node for n in self.nodes if n.gpus]

    @property
    def cuda_nodes(self) -> list[str]:
        return [n.node for n in self.nodes if n.cuda]

    @property
    def env(self) -> dict[str, Mapping[str, str]]:
        return {n.node: n.env for n in self.nodes if n.env}

    def with_image(self, name: str, image: str) -> GpuPlan:
        """The same plan with node `name` on `image` (a scenario's node on another torch)."""
        return GpuPlan(tuple(replace(n, image=image) if n.node == name else n for n in self.nodes))

    def describe(self) -> list[str]:
        """One line per node: its GPUs and its image (`up --dry-run`)."""
        return [f"{n.node}: {'GPU ' + ','.join(map(str, n.gpus)) if n.gpus else 'no GPU'}, image {n.image}"
                for n in self.nodes]


# ------------------------------------------------------------------------------------ syntax


def selection(gpus: str | None) -> str | int | tuple[int, ...] | None:
    """A parsed DDPLAB_GPUS as what it means: None, 'all', a count, or a tuple of indices."""
    if gpus is None or gpus == "all":
        return gpus
    if "," in gpus:
        return tuple(int(p) for p in gpus.split(",") if p)
    return int(gpus)


# -------------------------------------------------------------------------------------- plan


def _listing(have: Sequence[Gpu]) -> str:
    return "; ".join(f"{g.index}: {g.name}" for g in have)


def asked(config: LabSpec) -> str:
    """How the GPUs were asked for, to name in a message: '--gpus 2', or 'DDPLAB_GPUS=2 (from .env)'."""
    key, source = shown_key(config, "gpus"), shown_source(config, "gpus")
    return f"{key} {config.gpus}" if key.startswith("--") else f"{key}={config.gpus}" + (f" (from {source})" if source else "")


def choose_gpus(config: LabSpec, machine: Sequence[Gpu] | None) -> tuple[int, ...]:
    """The machine's GPU indices the lab gets, in the order nodes take them. `machine` None: not
    asked yet (a count then means GPUs 0..N-1, indices are taken as given)."""
    wanted = selection(config.gpus)
    if wanted is None:
        return ()
    asked_for = asked(config)
    if machine is None:
        if wanted == "all":
            raise StateError(f"{asked_for}: which GPUs 'all' is takes the machine's list (nvidia-smi)", hint=NO_GPU_HINT)
        return tuple(range(wanted)) if isinstance(wanted, int) else wanted
    have = sorted(machine, key=lambda g: g.index)
    if not have:
        raise StateError(f"{asked_for} asks for GPUs, and nvidia-smi lists none on this machine", hint=NO_GPU_HINT)
    indices = [g.index for g in have]
    if wanted == "all":
        return tuple(indices)
    if isinstance(wanted, int):
        if wanted > len(have):
            raise StateError(f"{asked_for} asks for {wanted} GPUs, and this machine has {len(have)} ({_listing(have)})",
                             hint=f"--gpus {len(have)} or --gpus all takes every one")
        return tuple(indices[:wanted])
    missing = [i for i in wanted if i not in indices]
    if missing:
        raise StateError(f"{asked_for} names GPU {', '.join(map(str, missing))}, and this machine has {len(have)} "
                         f"({_listing(have)})", hint=f"name GPUs from {', '.join(map(str, indices))}")
    return wanted


def split_gpus(config: LabSpec, chosen: tuple[int, ...], machine_unknown: bool = False) -> list[tuple[int, ...]]:
    """The GPU nodes' GPUs, `gpus_per_node` each in order: node0 the first K, node1 the next K."""
    per = config.gpus_per_node
    if not chosen:
        return []
    # "3 GPUs (0,1,2)" once they are the machine's own or named; a bare count not yet looked up is just "3 GPUs"
    shown = "" if config.gpus.isdigit() and machine_unknown else f" ({','.join(map(str, chosen))})"
    if len(chosen) % per:
        raise ConfigError(shown_key(config, "gpus_per_node"), per,
                          f"{len(chosen)} GPUs{shown} do not split evenly into nodes of {per}",
                          shown_source(config, "gpus_per_node"),
                          hint=f"ask a multiple of {per} GPUs, or a --gpus-per-node that divides {len(chosen)}")
    needed = len(chosen) // per
    if needed > config.nodes:
        per_fit = -(-len(chosen) // config.nodes)
        fits = f", or --gpus-per-node {per_fit} puts them on {config.nodes}" if len(chosen) % per_fit == 0 else ""
        raise ConfigError(shown_key(config, "gpus"), config.gpus,
                          f"{len(chosen)} GPUs{shown} at {per} a node need {needed} GPU nodes, and the lab has "
                          f"{config.nodes}", shown_source(config, "gpus"),
                          hint=f"--nodes {needed} gives every GPU a node{fits}; or ask fewer GPUs")
    return [chosen[i * per:(i + 1) * per] for i in range(needed)]


def cuda_nodes(config: LabSpec, gpu_nodes: list[str]) -> list[str]:
    """The nodes that run the CUDA image: every GPU node, and any others `cuda` names."""
    names, value = config.node_names, config.cuda
    key, source = shown_key(config, "cuda"), shown_source(config, "cuda")
    if value == AUTO:
        return list(gpu_nodes)
    if value == "all":
        chosen = names
    elif value.isdigit():
        if int(value) > len(names):
            raise ConfigError(key, value, f"asks for {value} CUDA nodes, and the lab has {len(names)}", source,
                              hint=f"--nodes {value} makes room for them, or --cuda all")
        chosen = names[:int(value)]
    else:
        listed = value.split(",")
        unknown = [n for n in listed if n not in names]
        if unknown:
            raise ConfigError(key, value, f"names {', '.join(unknown)}, and the lab has node0..node{len(names) - 1}",
                              source, hint="name nodes of the lab, or give --nodes to make it larger")
        chosen = [n for n in names if n in listed]
    left_out = [n for n in gpu_nodes if n not in chosen]
    if left_out:
        raise ConfigError(key, value, f"leaves out {', '.join(left_out)}, which {'get' if len(left_out) > 1 else 'gets'} "
                                      "a GPU: a node with a GPU must run the CUDA image", source,
                          hint=f"--cuda {len(gpu_nodes)} or --cuda all, or leave --cuda out (the GPU nodes)")
    return chosen


def build_gpu_plan(config: LabSpec, machine: Sequence[Gpu | tuple[int, str, str]] | None) -> GpuPlan:
    """Each node's GPUs, image and env additions, from the settings and the machine's GPUs (None:
    not asked, as on a lab without --gpus). Raises ConfigError for settings that do not fit
    together (exit 2) and StateError for GPUs the machine does not have (exit 1)."""
    have = None if machine is None else [g if isinstance(g, Gpu) else Gpu(*g) for g in machine]
    per_node = split_gpus(config, choose_gpus(config, have), machine_unknown=have is None)
    names = config.node_names
    gpu_nodes = names[:len(per_node)]
    cuda = set(cuda_nodes(config, gpu_nodes))
    backend = None if not per_node else "nccl" if len(per_node) == len(names) else "gloo"
    nodes = []
    for rank, name in enumerate(names):
        gpus = per_node[rank] if rank < len(per_node) else ()
        env = {"DDPLAB_BACKEND": backend} if backend else {}
        if gpus and config.nccl_transport == "socket":
            env.update(SOCKET_ONLY)
        image = config.cuda_image_tag if name in cuda else config.image_tag
        nodes.append(NodeGpus(name, gpus, name in cuda, image, env))
    return GpuPlan(tuple(nodes))


# ------------------------------------------------------------------------------ side effects


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """`nvidia-smi --query-gpu=index,name,uuid --format=csv,noheader`: '0, NVIDIA H100 80GB HBM3, GPU-…'."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3 and parts[0].isdigit():
            gpus.append(Gpu(int(parts[0]), ", ".join(parts[1:-1]), parts[-1]))
    return gpus


def detect_gpus(asked: str, run=None, which=None) -> list[Gpu]:
    """The machine's GPUs as nvidia-smi lists them; a StateError naming `asked` (e.g. '--gpus 1')
    when there is no nvidia-smi, it fails, or it lists none. One short command, no torch."""
    exe = (which or shutil.which)("nvidia-smi")
    if exe is None:
        raise StateError(f"{asked} needs an NVIDIA GPU, and this machine has no nvidia-smi on PATH (no NVIDIA driver)",
                         hint=NO_GPU_HINT)
    argv = [exe, "--query-gpu=index,name,uuid", "--format=csv,noheader"]
    try:
        result = (run or subprocess.run)(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise StateError(f"{asked}: nvidia-smi could not list the GPUs ({exc})", hint=NO_GPU_HINT) from None
    gpus = parse_nvidia_smi(result.stdout) if result.returncode == 0 else []
    if not gpus:
        said = (result.stderr or result.stdout).strip().splitlines()[-1:] or [f"exit status {result.returncode}"]
        raise StateError(f"{asked} needs an NVIDIA GPU, and nvidia-smi lists none on this machine ({said[0]})",
                         hint=NO_GPU_HINT)
    return gpus
