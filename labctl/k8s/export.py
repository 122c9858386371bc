"""The lab's job as a Kubernetes manifest: a Kubeflow TrainJob or a JobSet (`labctl k8s export`).

Pure: `build_trainjob` and `build_jobset` return the document as data, `render_manifest` its YAML
text with the comments a person needs (how to push the image and apply the file, what the lab has
that the cluster will not). Both run what `labctl run` runs: torchrun with the same SCRIPT ARGS, on
N nodes of P processes, with the run's `-e`/`--env-file` values and the lab's CPU kernels.

- TrainJob (trainer.kubeflow.org/v1alpha1) names the `torch-distributed` ClusterTrainingRuntime,
  whose torch plugin gives each pod PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR
  and PET_MASTER_PORT: torchrun reads its flags from them, so the command is a bare `torchrun`.
- JobSet (jobset.x-k8s.io/v1alpha2) is one replicated job of N indexed pods; the headless service
  JobSet makes gives the first pod a stable name, and torchrun's flags say it all.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from labctl.k8s.schema import API_VERSIONS

RUNTIME = "torch-distributed"  # Kubeflow Trainer's ClusterTrainingRuntime for torchrun jobs
NODE = "node"  # that runtime's replicated job and container; ddplab's JobSet uses the same name
MASTER_PORT = 29500  # the port Kubeflow's torch plugin gives PET_MASTER_PORT (constants.ContainerTrainerPort)
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
TORCH_ANNOTATION = "ddplab.io/torch-version"  # the torch the image carries: `k8s run` checks it against the lab's
GPU_RESOURCE = "nvidia.com/gpu"
KINDS = ("trainjob", "jobset")
NAME_MAX = 40  # a JobSet's longest pod name, NAME-node-0-<index>-<5 chars>, must stay within 63


@dataclass(frozen=True)
class ExportJob:
    """What the manifest runs and asks for. `args` is what follows torchrun's options (SCRIPT ARGS
    or -m MODULE ARGS); `cpus`, `memory` (a Kubernetes quantity) and `gpus` are per node."""

    name: str
    args: tuple[str, ...]
    image: str
    nodes: int
    nproc_per_node: int = 1
    env: dict[str, str] = field(default_factory=dict)
    cpus: float | None = None
    memory: str | None = None
    gpus: int = 0
    torch_version: str = ""
    lab: str = ""
    lab_image: str = ""  # the image the lab's nodes run; `image` differs where --image names the registry's
    workspace: str = ""
    shaped: tuple[str, ...] = ()  # the lab's shaped links, as `labctl shape --show` says them


def manifest_name(text: str) -> str:
    """`text` as a DNS-1035 label short enough for every pod name of either kind: lower case, a
    letter first, letters, digits and dashes."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    name = re.sub(r"-{2,}", "-", name)
    if not name or not name[0].isalpha():
        name = f"ddplab-{name}".rstrip("-")
    return name[:NAME_MAX].rstrip("-")


def default_name(lab: str, args: tuple[str, ...] | list[str]) -> str:
    """LAB-SCRIPT: `-m trainer` on lab demo gives demo-trainer; train.py gives demo-train."""
    script = args[1] if args and args[0] in ("-m", "--module") and len(args) > 1 else (args[0] if args else "job")
    stem = script.rsplit("/", 1)[-1].removesuffix(".py").replace(".", "-").replace("_", "-")
    return manifest_name(f"{lab}-{stem}")


def env_list(env: dict[str, str]) -> list[dict]:
    return [{"name": key, "value": value} for key, value in env.items()]


def resources(job: ExportJob) -> dict:
    """The lab's per-node limits as Kubernetes resources (requests default to the limits)."""
    limits: dict[str, object] = {}
    if job.cpus is not None:
        limits["cpu"] = int(job.cpus) if float(job.cpus).is_integer() else f"{round(job.cpus * 1000)}m"
    if job.memory:
        limits["memory"] = job.memory
    if job.gpus:
        limits[GPU_RESOURCE] = job.gpus
    return {"limits": limits} if limits else {}


def metadata(job: ExportJob) -> dict:
    meta: dict = {"name": job.name, "labels": {"app.kubernetes.io/created-by": "ddplab"}}
    if job.torch_version:
        meta["annotations"] = {TORCH_ANNOTATION: job.torch_version}
    return meta


def build_trainjob(job: ExportJob) -> dict:
    """A TrainJob on Kubeflow Trainer's torch-distributed runtime."""
    trainer: dict = {"numNodes": job.nodes, "numProcPerNode": job.nproc_per_node, "image": job.image,
                     "command": ["torchrun"], "args": list(job.args)}
    if job.env:
        trainer["env"] = env_list(job.env)
    if resources(job):
        trainer["resourcesPerNode"] = resources(job)
    return {"apiVersion": API_VERSIONS["TrainJob"], "kind": "TrainJob", "metadata": metadata(job),
            "spec": {"runtimeRef": {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime",
                                    "name": RUNTIME},
                     "trainer": trainer}}


def first_pod(name: str) -> str:
    """The stable DNS name of the JobSet's first pod: <jobset>-<replicated job>-<job>-<pod>.<subdomain>."""
    return f"{name}-{NODE}-0-0.{name}"


def torchrun_flags(job: ExportJob) -> list[str]:
    """torchrun's static rendezvous: the node rank is the pod's completion index, the store is on the
    first pod (Kubernetes expands $(VAR) in args from the container's environment)."""
    return [f"--nnodes={job.nodes}", f"--nproc-per-node={job.nproc_per_node}", "--node-rank=$(NODE_RANK)",
            "--master-addr=$(MASTER_ADDR)", "--master-port=$(MASTER_PORT)"]


def build_jobset(job: ExportJob) -> dict:
    """A JobSet: one replicated job of N indexed pods, torchrun on each."""
    env = [{"name": "MASTER_ADDR", "value": first_pod(job.name)}, {"name": "MASTER_PORT", "value": str(MASTER_PORT)},
           {"name": "NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX}}}, *env_list(job.env)]
    container: dict = {"name": NODE, "image": job.image, "command": ["torchrun"],
                       "args": [*torchrun_flags(job), *job.args], "env": env,
                       "ports": [{"containerPort": MASTER_PORT, "name": "rendezvous"}]}
    if resources(job):
        container["resources"] = resources(job)
    pods = {"parallelism": job.nodes, "completions": job.nodes, "completionMode": "Indexed", "backoffLimit": 0,
            "template": {"spec": {"restartPolicy": "Never", "containers": [container]}}}
    return {"apiVersion": API_VERSIONS["JobSet"], "kind": "JobSet", "metadata": metadata(job),
            "spec": {"network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
                     "successPolicy": {"operator": "All"}, "failurePolicy": {"maxRestarts": 0},
                     "replicatedJobs": [{"name": NODE, "replicas": 1, "template": {"spec": pods}}]}}


def build_manifest(kind: str, job: ExportJob) -> dict:
    return build_trainjob(job) if kind == "trainjob" else build_jobset(job)


def header(kind: str, job: ExportJob, out: str) -> list[str]:
    """What the file is, how to take it to a cluster, and what the lab has that the cluster will not."""
    what = ("A Kubeflow TrainJob (Trainer 2.2 or later, its torch-distributed runtime)" if kind == "trainjob"
            else "A JobSet (jobset.x-k8s.io, v0.5 or later)")
    file = out if out not in ("", "-") else "FILE"
    registry = job.image if job.image != job.lab_image else "REGISTRY/NAME:TAG"
    lines = [
        f"{what},",
        f"written by `labctl k8s export` (ddplab) from lab {job.lab}. It is the job that",
        f"`labctl run -- {' '.join(job.args)}` runs there: {job.nodes} node(s) x {job.nproc_per_node} process(es).",
        f"`labctl k8s run {file}` runs this file on the lab.",
        "",
        "On your cluster:",
        "  1. push the lab's node image where the cluster pulls images from:",
        f"       docker tag {job.lab_image} {registry}",
        f"       docker push {registry}",
        *(["     and set image below to it (`labctl k8s export --image REGISTRY/NAME:TAG` writes it);"]
          if registry != job.image else []),
        f"  2. kubectl apply -f {file}",
        f"  3. kubectl get {'trainjob' if kind == 'trainjob' else 'jobset'} {job.name}",
        f"     kubectl logs -l jobset.sigs.k8s.io/jobset-name={job.name} -f --prefix",
        "",
        "What the lab has and Kubernetes will not:",
        f"  - the workspace: every lab node sees {job.workspace or 'your project'} at the same path; a pod sees",
        "    only its image. Put your code into the image (FROM it, COPY your project) or onto a volume.",
        "    (`-m trainer` is in the image, /opt/ddplab/trainer.)",
        "  - the shared volume: /shared is one folder on every lab node; pods share none unless you give",
        "    them one (a ReadWriteMany PersistentVolumeClaim, mounted through the runtime's patches).",
        "  - shaped links: pods talk over the cluster's network as it is"
        + (f"; the lab's: {'; '.join(job.shaped)}." if job.shaped else "."),
        *(["  - the lab's CPU kernels (ATEN_CPU_CAPABILITY and the rest in env below) come along: the loss",
           "    matches the lab's."] if "ATEN_CPU_CAPABILITY" in job.env else []),
    ]
    return [f"# {line}".rstrip() for line in lines]


NOTES = {
    "numProcPerNode:": ["Processes per node: TrainJob's own numProcPerNode, an integer since Trainer 2.2 (which removed",
                        "the runtime's mlPolicy.torch.numProcPerNode); the torch plugin hands it to torchrun as",
                        "PET_NPROC_PER_NODE, with PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR and PET_MASTER_PORT."],
    "network:": ["JobSet makes a headless service named after the JobSet: pod i of the job is",
                 "<name>-node-0-i.<name>, so the first pod's name is the rendezvous address."],
    "- --node-rank=$(NODE_RANK)": ["the pod's completion index (0..N-1), from NODE_RANK below"],
}


def render_manifest(kind: str, job: ExportJob, out: str = "") -> str:
    """The manifest's YAML, its header and notes as comments."""
    import yaml

    text = yaml.safe_dump(build_manifest(kind, job), sort_keys=False, default_flow_style=False, width=120)
    lines: list[str] = []
    for line in text.splitlines():
        stripped = line.lstrip()
        for key, note in NOTES.items():
            if stripped.startswith(key):
                indent = line[: len(line) - len(stripped)]
                lines += [f"{indent}# {part}" for part in note]
        lines.append(line)
    return "\n".join([*header(kind, job, out), *lines, ""])
