"""The lab and Kubernetes (side effects): `labctl k8s export` writes the lab's job as a TrainJob or
a JobSet; `labctl k8s run FILE` runs such a manifest on the lab's nodes as Kubernetes would run it.

A run is a RunPlan like `labctl run`'s, executed and judged the same way (the root cause, its node,
the exit status, the SUMMARY): only each node's process differs. Each node runs the pod's command
and args with the pod's environment (the manifest's `env`; for a TrainJob, the torch runtime's
PET_* first), under `env -u` for the lab's own rendezvous variables (its env file's MASTER_ADDR,
NODE_RANK, PET_RDZV_*...), which no pod has; a `python` or `torchrun` command is forked by the
node's fork server, as `labctl run` starts its processes (labctl.k8s.pods.warm). The manifest's
CPU and memory limits are the nodes' for the run, and the nodes get their own back after it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from labctl.core.outfile import write_text
from labctl.engine.docker import apply_node_cpus, apply_node_memory, engine_cpus, node_limits
from labctl.engine.labels import container_name
from labctl.errors import ConfigError, StateError
from labctl.k8s.export import KINDS, ExportJob, default_name, manifest_name, render_manifest
from labctl.k8s.manifest import ManifestError, PodJob, load_manifest
from labctl.k8s.pods import describe_job, pod_argv, pod_env, read_job, warm
from labctl.net.apply import node_addresses
from labctl.run.launch import PG_TIMEOUT_VAR, Launch, run_env, threads_per_process
from labctl.run.plan import RunPlan, new_run
from labctl.run.result import RunResult
from labctl.session import LabSession
from labctl.spec.labspec import CPU_KERNEL_ENV
from labctl.spec.parsers import parse_memory

TORCH_LABEL = "io.ddplab.torch-version"  # the node image's (Dockerfile)
PG_TIMEOUT_S = 30.0  # as `labctl run`: a lost peer fails the run in 30 s, not torch's 10 minutes


@dataclass(frozen=True)
class PodRun:
    """A manifest ready to run: the job as read, the lab's plan of it, and what `--dry-run` says."""

    job: PodJob
    plan: RunPlan
    lines: list[str]


def gib_quantity(docker_memory: str | None) -> str | None:
    """A Docker size (4g, 512m) as a Kubernetes quantity (4Gi, 512Mi)."""
    if not docker_memory:
        return None
    size = parse_memory(docker_memory)
    for unit, scale in (("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if size % scale == 0:
            return f"{size // scale}{unit}"
    return str(size)


class Kubernetes:
    """A lab and Kubernetes (`Lab.k8s`), as `labctl k8s` uses it: `export_job` and `export` write the
    lab's job as a TrainJob or a JobSet; `plan` reads a manifest as the lab will run it (checked
    against the API and against the lab, nothing started) and `run` runs that plan, returning the
    RunResult `Lab.run` would (RunFailed, with it, when a pod fails and `check` is on)."""

    def __init__(self, session: LabSession):
        self.session = session

    def _running(self) -> list:
        """The lab's nodes as the engine has them; none where there is no engine (`k8s export` needs none)."""
        try:
            return self.session.status()
        except StateError:
            return []

    def lab_image(self, nodes: list | None = None) -> tuple[str, str]:
        """(the image the lab's nodes run, its torch release): the running lab's, else what `up` would run.
        `nodes`: the lab's, where the caller has read them already."""
        config = self.session.config
        nodes = self._running() if nodes is None else nodes
        if not nodes:
            return config.image_tag, config.torch_version
        api = self.session.client.api
        image = api.inspect_container(container_name(self.session.name, nodes[0].name))["Config"]["Image"]
        labels = api.inspect_image(image)["Config"].get("Labels") or {}
        return image, labels.get(TORCH_LABEL) or nodes[0].torch.split("+")[0]

    def export_job(self, args: list[str], *, nodes: int | None = None, nproc_per_node: int | None = None,
                   image: str | None = None, name: str | None = None, env: dict[str, str] | None = None) -> ExportJob:
        """The job `labctl run -- ARGS` runs on the lab, as a manifest states it."""
        config, running = self.session.config, self._running()
        lab_image, torch = self.lab_image(running)
        if name is not None and manifest_name(name) != name:
            raise ConfigError("--name", name, "must be a DNS label of at most 40 characters: lower-case letters, "
                              "digits and -, a letter first", hint=f"--name {manifest_name(name)}")
        shaped = (f"every link at {config.bw}",) if config.bw else ()
        return ExportJob(name=name or default_name(self.session.name, args), args=tuple(args),
                         image=image or lab_image, nodes=nodes or len(running) or config.nodes,
                         nproc_per_node=nproc_per_node or config.nproc_per_node,
                         env={**CPU_KERNEL_ENV[config.cpu_kernels], **(env or {})}, cpus=config.cpus,
                         memory=gib_quantity(config.memory), gpus=config.gpus_per_node if config.gpus else 0,
                         torch_version=torch, lab=self.session.name, lab_image=lab_image,
                         workspace=str(self.session.workspace), shaped=shaped)

    def export(self, kind: str, job: ExportJob, out: str | Path) -> Path:
        """Write the manifest of `job` (kind trainjob or jobset) to `out` (`-`: standard output)."""
        if kind not in KINDS:
            raise ConfigError("--kind", kind, f"must be one of {', '.join(KINDS)}")
        try:
            write_text(out, render_manifest(kind, job, str(out)))
        except OSError as exc:
            raise ConfigError("--out", str(out), f"must be a file that can be written ({exc.strerror})",
                              hint=f"labctl k8s export -o {kind}.yaml -- -m trainer, or -o - for standard output") from None
        return Path(out)

    # ------------------------------------------------------------------------------------------ run

    def read(self, path: str | Path) -> PodJob:
        """The manifest at `path`, checked and read as the lab runs it."""
        path = Path(path)
        try:
            text = path.read_text()
        except (OSError, UnicodeError) as exc:  # no such file, a folder, not text, a name no file can have
            raise ConfigError("FILE", str(path), f"cannot be read: {getattr(exc, 'strerror', None) or exc}",
                              hint="the path of a TrainJob or JobSet manifest (`labctl k8s export` writes one)") from None
        return read_job(load_manifest(text, str(path)), str(path), self.session.config.master_port)

    def _check(self, job: PodJob, names: list[str], ignore_image: bool) -> list[str]:
        """Refuse what the lab cannot be (fewer nodes than `names`, no GPUs, another torch); the lines it adds
        to the plan."""
        if job.nodes > len(names):
            raise StateError(f"{job.source}: the {job.kind} asks for {job.nodes} nodes and lab {self.session.name} "
                             f"has {len(names)}", hint=f"labctl up --lab {self.session.name} --nodes {job.nodes}")
        if job.gpus and not self.session.config.gpus:
            raise StateError(f"{job.source}: asks for {job.gpus} GPU(s) per node and lab {self.session.name} has "
                             "none", hint="labctl up --gpus all (on a machine with NVIDIA GPUs), or drop nvidia.com/gpu")
        cpus = engine_cpus(self.session.client)
        if job.cpus is not None and job.cpus > cpus:
            raise ManifestError(job.source, job.cpu_at, f"{job.cpus:g} CPUs per node, and this "
                                f"machine has {cpus}: a node cannot have more than the machine",
                                hint=f"at most {cpus} (the lab's nodes share this machine's CPUs; `k8s export` "
                                     "writes the lab's own limits)")
        image, torch = self.lab_image()
        if job.image == image:
            return [f"runs on: the lab's own image ({image})"]
        if job.image_torch and job.image_torch != torch and not ignore_image:
            raise ManifestError(job.source, job.image_at,
                                f"{job.image} has torch {job.image_torch}, and the lab's nodes run torch {torch}: a "
                                "run would not be the job's",
                                hint=f"--ignore-image runs it on the lab's torch anyway; `labctl up --torch-version "
                                     f"{job.image_torch}` makes a lab of its")
        said = f"torch {job.image_torch}" if job.image_torch else "torch not said (no annotation, no version in the tag)"
        return [f"runs on: the lab's own image, {image} (torch {torch}), in place of {job.image} ({said})"]

    def plan(self, path: str | Path, *, ignore_image: bool = False, timeout_s: float | None = None) -> PodRun:
        """The lab's run of the manifest at `path`: nothing starts."""
        job = self.read(path)
        names = self.session.node_names()
        lines = [*describe_job(job), *self._check(job, names, ignore_image)]
        names = names[: job.nodes]
        node_env = self.session.node_env(names)
        found = node_addresses(self.session.client, self.session.name)
        addresses = [found[name] for name in names]
        run_id, run_dir = new_run(self.session.directory)
        common = {**run_env(run_id, run_dir), PG_TIMEOUT_VAR: f"{PG_TIMEOUT_S:g}"}
        nproc = int(job.nproc_per_node) if job.nproc_per_node.isdigit() else 1
        common["OMP_NUM_THREADS"] = str(threads_per_process(self.session.cpus, job.nodes * nproc, 1))
        launches = []
        for index, name in enumerate(names):
            env = pod_env(job, index, addresses)
            unset = [arg for key in node_env[name] if key not in env for arg in ("-u", key)
                     if key.startswith("PET_") or key in LAB_IDENTITY]
            launches.append(Launch(name, name, ["env", *unset, *warm(pod_argv(job, env, addresses))], {**common, **env}))
        timeout = timeout_s if timeout_s is not None else job.timeout_s
        plan = RunPlan(run_id, run_dir, node_env, launches, store=False, timeout_s=timeout,
                       launcher=job.kind, why=f"each node runs pod i's command, as Kubernetes would start {job.name}")
        return PodRun(job, plan, lines)

    def run(self, pods: PodRun, *, echo: bool | str = True, check: bool = True) -> RunResult:
        """Run the plan with the manifest's limits on its nodes, then give the nodes their own back."""
        client, lab, job = self.session.client, self.session.name, pods.job
        before = {name: node_limits(client, lab, name) for name in pods.plan.nodes}
        cpus = {name: old[0] for name, old in before.items()
                if job.cpus is not None and round(job.cpus * 1e9) != old[0]}  # node -> its NanoCpus
        memory = {name: old[1] for name, old in before.items()
                  if job.memory_bytes is not None and job.memory_bytes != old[1]}  # node -> its Memory
        purpose = f"{job.source}'s CPU limit"
        try:
            for name in cpus:
                apply_node_cpus(client, lab, name, job.cpus, purpose)
            for name in memory:
                apply_node_memory(client, lab, name, job.memory_bytes, before[name])
            return self.session.execute(pods.plan, echo=echo, check=check)
        finally:
            for name, nano in cpus.items():
                apply_node_cpus(client, lab, name, nano / 1e9 or None, purpose)
            for name, mem in memory.items():
                apply_node_memory(client, lab, name, mem or None, before[name])

# The lab's identity in each node's env file, which no pod has (PET_* is left out as a prefix).
LAB_IDENTITY = ("MASTER_ADDR", "MASTER_PORT", "NNODES", "NODE_RANK", "NPROC_PER_NODE", "WORLD_SIZE")
