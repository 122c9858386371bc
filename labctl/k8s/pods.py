"""What each pod of a manifest's job runs, as Kubernetes would start it: `read_job` turns a checked
manifest (labctl.k8s.manifest.load_manifest) into a PodJob, `pod_env` and `pod_argv` give pod i's
environment and command line with the pods' DNS names replaced by the lab's node addresses. Pure.
"""

from __future__ import annotations

import math
import re
import shlex

from labctl.k8s.export import NODE, RUNTIME
from labctl.k8s.manifest import (
    INDEX,
    PET_KEYS,
    REF_RE,
    RUNTIME_IMAGE,
    ManifestError,
    PodJob,
    env_entries,
    image_torch,
    quantity,
    read_limits,
)
from labctl.run.launch import TORCHRUN_MODULE, warm_argv

# TrainJob fields the lab does not act on, and what they would do on a cluster.
TRAINJOB_UNHONOURED = {
    "initializer": "the dataset and model initializers (the lab's nodes share the workspace instead)",
    "runtimePatches": "the runtime patches (node selectors, tolerations, volumes, service accounts)",
    "managedBy": "the controller named in managedBy",
}
# Pod spec fields the lab does not act on.
POD_UNHONOURED = ("volumes", "nodeSelector", "affinity", "tolerations", "initContainers", "serviceAccountName",
                  "imagePullSecrets", "securityContext", "hostNetwork", "priorityClassName", "schedulerName")


def read_job(doc: dict, source: str, master_port: int) -> PodJob:
    """The job of a manifest `load_manifest` has checked; `master_port` is the lab's rendezvous port."""
    return (read_trainjob if doc["kind"] == "TrainJob" else read_jobset)(doc, source, master_port)


def _cpus_asked(res: dict) -> float | None:
    """The CPUs the torch plugin counts processes by: the request, else the limit."""
    raw = (res.get("requests") or {}).get("cpu") or (res.get("limits") or {}).get("cpu")
    return quantity(raw) if raw is not None else None


def cpu_field(res: dict, where: str) -> str:
    """The path of the CPU limit the lab applies: the limit's, else the request's."""
    return f"{where}.{'limits' if 'cpu' in (res.get('limits') or {}) else 'requests'}.cpu"


def read_trainjob(doc: dict, source: str, master_port: int) -> PodJob:
    spec, name = doc["spec"], doc["metadata"]["name"]
    ref = spec["runtimeRef"]
    if not ref["name"].startswith("torch"):
        raise ManifestError(source, "spec.runtimeRef.name", f"{ref['name']!r}: the lab runs the torch runtime's "
                            f"way ({RUNTIME}); MPI, JAX and DeepSpeed runtimes start their processes otherwise",
                            hint=f"name: {RUNTIME}")
    trainer = spec.get("trainer") or {}
    if not trainer.get("command"):
        raise ManifestError(source, "spec.trainer.command", "is missing: the torch-distributed runtime has no "
                            "command of its own, so each pod would run the image's default",
                            hint="command: [torchrun, train.py] (torchrun takes its flags from the PET_* variables "
                                 "the runtime sets)")
    reserved = [var["name"] for var in trainer.get("env") or [] if var["name"] in PET_KEYS]
    if reserved:
        raise ManifestError(source, "spec.trainer.env", f"sets {', '.join(reserved)}, which the torch runtime sets "
                            "for every pod (Kubeflow refuses the TrainJob)", hint="numNodes and numProcPerNode say it")
    where = "spec.trainer.resourcesPerNode"
    res = trainer.get("resourcesPerNode") or {}
    cpus, memory, gpus, notes = read_limits(res, source, where)
    unhonoured = [f"spec.{key}: {what}" for key, what in TRAINJOB_UNHONOURED.items() if key in spec]
    if spec.get("suspend"):
        unhonoured.append("spec.suspend: true (Kubernetes would hold the job until it is resumed; the lab runs it now)")
    env = env_entries(trainer.get("env"), source, "spec.trainer.env", unhonoured)
    nodes = trainer.get("numNodes", 1)
    nproc = (str(trainer["numProcPerNode"]) if trainer.get("numProcPerNode") is not None
             else "auto" if gpus else str(max(1, math.ceil(_cpus_asked(res) or 0))))
    first = f"{name}-{NODE}-0-0.{name}"
    runtime = [("PET_NNODES", str(nodes)), ("PET_NPROC_PER_NODE", nproc), ("PET_NODE_RANK", INDEX),
               ("PET_MASTER_ADDR", first), ("PET_MASTER_PORT", str(master_port))]
    image = trainer.get("image") or RUNTIME_IMAGE
    if not trainer.get("image"):
        notes.append(f"spec.trainer.image unset: the runtime's, {RUNTIME_IMAGE}")
    return PodJob(kind="TrainJob", name=name, source=source, nodes=nodes, nproc_per_node=nproc,
                  command=tuple(trainer["command"]), args=tuple(trainer.get("args", ())), env=tuple(runtime + env),
                  image=image, image_torch=image_torch(image, doc["metadata"].get("annotations") or {}),
                  pod_names=tuple(f"{name}-{NODE}-0-{i}.{name}" for i in range(nodes)), cpus=cpus,
                  memory_bytes=memory, gpus=gpus, timeout_s=spec.get("activeDeadlineSeconds"), master_port=master_port,
                  cpu_at=cpu_field(res, where), image_at="spec.trainer.image", unhonoured=tuple(unhonoured),
                  notes=tuple(notes))


def read_jobset(doc: dict, source: str, master_port: int) -> PodJob:
    spec, name = doc["spec"], doc["metadata"]["name"]
    jobs = spec["replicatedJobs"]
    if len(jobs) != 1 or jobs[0].get("replicas", 1) != 1:
        where = "spec.replicatedJobs" if len(jobs) != 1 else "spec.replicatedJobs[0].replicas"
        raise ManifestError(source, where, "the lab runs one replicated job of one Job (its pods are the nodes); "
                            f"this has {len(jobs)} replicated job(s)" + (f", {jobs[0].get('replicas')} replicas"
                                                                         if len(jobs) == 1 else ""),
                            hint="one replicated job, replicas: 1, parallelism: N (as `labctl k8s export --kind jobset` "
                                 "writes it)")
    job, base = jobs[0], "spec.replicatedJobs[0].template.spec"
    pods = job["template"]["spec"]
    nodes = pods.get("parallelism", 1)
    if pods.get("completions", nodes) != nodes:
        raise ManifestError(source, f"{base}.completions", f"{pods.get('completions')} differs from parallelism "
                            f"{nodes}: a training job's pods all run at once", hint=f"completions: {nodes}")
    pod = pods["template"]["spec"]
    container, where = pod["containers"][0], f"{base}.template.spec.containers[0]"
    if not container.get("command"):
        raise ManifestError(source, f"{where}.command", "is missing: the lab does not run an image's default "
                            "command", hint="command: [torchrun], its flags in args")
    unhonoured = [f"{base}.template.spec.{key}" for key in POD_UNHONOURED if key in pod]
    unhonoured += [f"{base}.template.spec.containers[{i}] {c['name']}: a second container (the lab runs the first)"
                   for i, c in enumerate(pod["containers"][1:], 1)]
    if pods.get("backoffLimit", 6) or (spec.get("failurePolicy") or {}).get("maxRestarts"):
        unhonoured.append("restarts (backoffLimit, failurePolicy.maxRestarts): a failed pod ends the run, as with "
                          "backoffLimit: 0")
    if pods.get("completionMode", "Indexed") != "Indexed":
        unhonoured.append(f"{base}.completionMode NonIndexed: the pods get no completion index")
    cpus, memory, gpus, notes = read_limits(container.get("resources") or {}, source, f"{where}.resources")
    env = env_entries(container.get("env"), source, f"{where}.env", unhonoured)
    subdomain = (spec.get("network") or {}).get("subdomain") or name
    image = container.get("image", "")
    return PodJob(kind="JobSet", name=name, source=source, nodes=nodes, nproc_per_node="",
                  command=tuple(container["command"]), args=tuple(container.get("args", ())), env=tuple(env),
                  image=image, image_torch=image_torch(image, doc["metadata"].get("annotations") or {}),
                  pod_names=tuple(f"{name}-{job['name']}-0-{i}.{subdomain}" for i in range(nodes)), cpus=cpus,
                  memory_bytes=memory, gpus=gpus, timeout_s=pods.get("activeDeadlineSeconds"), master_port=master_port,
                  cpu_at=cpu_field(container.get("resources") or {}, f"{where}.resources"), image_at=f"{where}.image",
                  unhonoured=tuple(unhonoured), notes=tuple(notes))


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: a defined VAR's value, an undefined one left as written, $$ a $."""
    return REF_RE.sub(lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


def to_addresses(text: str, job: PodJob, addresses: list[str]) -> str:
    """`text` with each pod's DNS name (and its longer forms: .namespace.svc.cluster.local) as the
    lab's address of that node."""
    for pod, address in sorted(zip(job.pod_names, addresses), key=lambda pair: -len(pair[0])):
        text = re_pod(pod).sub(address, text)
    return text


def re_pod(pod: str) -> re.Pattern:
    return re.compile(re.escape(pod) + r"(?:\.[a-z0-9-]+)*(?:\.svc(?:\.[a-z0-9.-]+)?)?(?![a-z0-9-])")


def pod_env(job: PodJob, index: int, addresses: list[str]) -> dict[str, str]:
    """Pod `index`'s environment from the manifest: values in order, each expanded from the ones before."""
    env: dict[str, str] = {}
    for name, value in job.env:
        env[name] = str(index) if value is INDEX else expand(to_addresses(str(value), job, addresses), env)
    return env


def pod_argv(job: PodJob, env: dict[str, str], addresses: list[str]) -> list[str]:
    """The pod's command and args, as Kubernetes expands them from its environment."""
    return [expand(to_addresses(part, job, addresses), env) for part in (*job.command, *job.args)]


def warm(argv: list[str]) -> list[str]:
    """A pod's command as the lab starts it, forked by the node's fork server as `labctl run` forks its
    processes (started cold, as written, where a node has none): `python SCRIPT ARGS` and `python -m
    MODULE ARGS` as a warm worker; `torchrun ARGS` as a warm agent (`-m torch.distributed.run`, what the
    command runs), whose workers start as ARGS say. Anything else (another program, a python option
    first, a python named by its path) as it is."""
    if len(argv) >= 2 and argv[0] in ("python", "python3"):
        first = argv[1]
        if not first.startswith("-") or (first == "-m" and len(argv) > 2 and not argv[2].startswith("-")):
            return warm_argv(argv[1:])
    if argv and argv[0] == "torchrun":
        return warm_argv(["-m", TORCHRUN_MODULE, *argv[1:]])
    return argv


def shown_command(job: PodJob) -> str:
    """The pod's command line as a person reads it: an inline script as its line count."""
    return shlex.join(part if "\n" not in part else f"<a script of {part.count(chr(10)) + 1} lines>"
                      for part in (*job.command, *job.args))


def describe_job(job: PodJob) -> list[str]:
    """What the lab takes from the manifest, as `k8s run --dry-run` shows it."""
    limits = [f"{job.cpus:g} CPUs" if job.cpus is not None else "", f"{job.memory_bytes / 2**30:.3g} GiB memory"
              if job.memory_bytes else "", f"{job.gpus} GPU(s)" if job.gpus else ""]
    lines = [f"{job.kind} {job.name} from {job.source}: {job.nodes} pod(s) on nodes 0..{job.nodes - 1}",
             f"command: {shown_command(job)}",
             f"image: {job.image}" + (f" (torch {job.image_torch})" if job.image_torch else ""),
             "limits per node: " + (", ".join(part for part in limits if part) or "none")]
    if job.kind == "TrainJob":
        lines.append(f"processes per node: PET_NPROC_PER_NODE={job.nproc_per_node}")
    if not job.torchrun:
        lines.append(f"note: the command is {job.command[0]}, not torchrun: nothing starts a process per GPU or sets "
                     "RANK and WORLD_SIZE; each pod trains alone unless the script reads " +
                     ("the PET_* variables" if job.kind == "TrainJob" else "its environment") + " itself")
    return lines + [f"note: {note}" for note in job.notes] + [f"not honoured: {item}" for item in job.unhonoured]

