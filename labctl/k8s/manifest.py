"""A TrainJob or JobSet manifest read as the lab will run it (`labctl k8s run FILE`). Pure: parses
text into a `PodJob` and says, per pod, the command and the environment Kubernetes would give it.

Read as Kubernetes reads it:
- TrainJob: `numNodes` pods (the runtime's 1 when unset), each with the torch plugin's PET_NNODES,
  PET_NPROC_PER_NODE (numProcPerNode; else, without GPUs, the CPUs asked for, at least 1; with
  them "auto"), PET_NODE_RANK (the pod's completion index), PET_MASTER_ADDR (the first pod) and
  PET_MASTER_PORT, then the trainer's `env`; its `command` and `args` run as given.
- JobSet: one replicated job of `parallelism` pods; `fieldRef` to the completion index is the pod's
  index; the first pods' DNS names (<jobset>-<job>-0-<i>.<subdomain>) are the lab's nodes.
- In both: `$(VAR)` in command, args and env values expands from the container's environment
  (`$$` escapes it), and CPU and memory limits (or requests, where no limit is given) become the
  nodes' limits for the run.

What the lab cannot honour (volumes, node selectors, an initializer, secrets) is listed, not dropped
without a word; what it could only get wrong (a kind it does not know, an ill-typed field, no
command) is an error naming the field and the file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from labctl.errors import LabError
from labctl.k8s.export import COMPLETION_INDEX, GPU_RESOURCE, MASTER_PORT, TORCH_ANNOTATION
from labctl.k8s.schema import API_VERSIONS, schema_errors

INDEX = object()  # an env value Kubernetes takes from the pod's completion index
# The runtime's image when a TrainJob names none (torch-distributed at Trainer 2.3).
RUNTIME_IMAGE = "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"
TORCH_TAG_RE = re.compile(r"(?:^|/)pytorch:(\d+\.\d+\.\d+)|:torch(\d+\.\d+\.\d+)")
REF_RE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
QUANTITY_RE = re.compile(r"^([0-9.]+(?:[eE][+-]?[0-9]+)?)([numkKMGTPE]i?)?$")
SUFFIX = {"": 1, "n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
          "E": 1e18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
PET_KEYS = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")


class ManifestError(LabError):
    """A manifest the lab cannot run as written: names the file and the field (exit status 2)."""

    def __init__(self, source: str, where: str, problem: str, hint: str | None = None):
        super().__init__(f"{source}: {where}: {problem}", hint)
        self.field = where


@dataclass(frozen=True)
class PodJob:
    """A manifest's job as the lab runs it. `env` is in the container's order, a value INDEX where
    the pod's completion index goes; `pod_names` are the DNS names of pods 0..N-1."""

    kind: str
    name: str
    source: str
    nodes: int
    nproc_per_node: str  # as PET_NPROC_PER_NODE says it: a number, or "auto"
    command: tuple[str, ...]
    args: tuple[str, ...]
    env: tuple[tuple[str, object], ...]
    image: str
    image_torch: str  # the torch the manifest says its image has ("": it does not say)
    pod_names: tuple[str, ...]
    cpus: float | None = None
    memory_bytes: int | None = None
    gpus: int = 0
    timeout_s: float | None = None
    master_port: int = MASTER_PORT
    cpu_at: str = ""  # the field the CPU limit came from, for errors naming it
    image_at: str = "spec.trainer.image"  # the image's field
    unhonoured: tuple[str, ...] = field(default=())
    notes: tuple[str, ...] = field(default=())

    @property
    def torchrun(self) -> bool:
        return bool(self.command) and Path(self.command[0]).name == "torchrun"


def load_manifest(text: str, source: str) -> dict:
    """The one YAML document in `text`, checked against its kind's schema."""
    import yaml

    try:
        docs = [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(the document)"
        raise ManifestError(source, where, f"not YAML: {getattr(exc, 'problem', None) or exc}",
                            hint="a manifest is one YAML document: kind, apiVersion, metadata, spec") from None
    if len(docs) != 1 or not isinstance(docs[0], dict):
        raise ManifestError(source, "(the document)", f"expected one YAML mapping (a TrainJob or a JobSet), found "
                            f"{len(docs)} document(s)" + ("" if not docs else f", the first a {type(docs[0]).__name__}"),
                            hint="one manifest per file; `labctl k8s export` writes one")
    doc = docs[0]
    kind = doc.get("kind")
    if kind not in API_VERSIONS:
        raise ManifestError(source, "kind", f"{kind!r} is not a kind the lab runs: TrainJob "
                            f"({API_VERSIONS['TrainJob']}) or JobSet ({API_VERSIONS['JobSet']})",
                            hint="PyTorchJob (kubeflow.org/v1) is TrainJob's predecessor: Kubeflow's migration guide "
                                 "turns one into the other")
    errors = schema_errors(doc, kind)
    if errors:
        where, problem = errors[0]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ManifestError(source, where, problem + more,
                            hint=f"the {kind} fields the lab reads, and their types: the Kubernetes "
                            f"how-to (docs/how-to/kubernetes.md); `labctl k8s export` writes a valid {kind}")
    return doc


def quantity(text: object) -> float:
    """A Kubernetes quantity (2, "500m", "4Gi", "1e9") as a number."""
    match = QUANTITY_RE.match(str(text).strip())
    if not match:
        raise ValueError(text)
    return float(match.group(1)) * SUFFIX[match.group(2) or ""]


def image_torch(image: str, annotations: dict) -> str:
    """The torch release the manifest says its image carries: ddplab's annotation, else the tag's
    (pytorch/pytorch:2.13.0-..., ddplab-node:torch2.13.0-cpu); "" when it says nothing."""
    if annotations.get(TORCH_ANNOTATION):
        return str(annotations[TORCH_ANNOTATION])
    match = TORCH_TAG_RE.search(image)
    return (match.group(1) or match.group(2)) if match else ""


def read_limits(res: dict, source: str, where: str) -> tuple[float | None, int | None, int, list[str]]:
    """(CPUs, memory bytes, GPUs, notes) from a ResourceRequirements: its limits, else its requests."""
    limits, requests, notes = res.get("limits") or {}, res.get("requests") or {}, []
    values = {}
    for key in ("cpu", "memory", GPU_RESOURCE):
        raw = limits.get(key, requests.get(key))
        if raw is None:
            continue
        try:
            values[key] = quantity(raw)
        except ValueError:
            raise ManifestError(source, f"{where}.{'limits' if key in limits else 'requests'}.{key}",
                                f"{raw!r} is not a quantity", hint="e.g. cpu: 2 or 500m, memory: 4Gi") from None
        if key not in limits:
            notes.append(f"{key}: the request {raw} is taken as the node's limit (the lab has no scheduler to "
                         "guarantee it)")
    other = sorted({*limits, *requests} - {"cpu", "memory", GPU_RESOURCE})
    notes += [f"{where}: {key} is not a resource the lab has" for key in other]
    memory = values.get("memory")
    return values.get("cpu"), int(memory) if memory is not None else None, int(values.get(GPU_RESOURCE, 0)), notes


def env_entries(env: list[dict], source: str, where: str, unhonoured: list[str]) -> list[tuple[str, object]]:
    """(name, value) per EnvVar; INDEX for the completion index; a valueFrom the lab cannot give is listed."""
    entries: list[tuple[str, object]] = []
    for i, var in enumerate(env or []):
        if "valueFrom" not in var:
            entries.append((var["name"], str(var.get("value", ""))))
        elif (var["valueFrom"].get("fieldRef") or {}).get("fieldPath", "").replace('"', "'") == COMPLETION_INDEX:
            entries.append((var["name"], INDEX))
        else:
            unhonoured.append(f"{where}[{i}] {var['name']}: valueFrom {', '.join(var['valueFrom'])} (left unset: "
                              "give it with -e)")
    return entries

