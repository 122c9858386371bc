"""The lab and Kubernetes: `labctl k8s export|run`."""

from __future__ import annotations

from pathlib import Path

import click

from labctl.api.inputs import MANIFEST_KINDS, build_user_env, job_args
from labctl.cli.app import CONTEXT, invocation, main
from labctl.cli.lazy import render
from labctl.cli.options import (
    SCRIPT_CONTEXT,
    FilePath,
    dry_run_option,
    env_options,
    json_option,
    lab_option,
    nproc_option,
    script_argument,
)
from labctl.core.outfile import is_stdout
from labctl.core.ui import info
from labctl.spec.labspec import check_nproc


@main.group(context_settings=CONTEXT)
def k8s() -> None:
    """The lab's job as a Kubeflow TrainJob or a JobSet, and such a manifest run on the lab.

    \b
    Examples:
      labctl k8s export -- -m trainer --epochs 1                       # trainjob.yaml
      labctl k8s export --kind jobset -o - -- -m trainer | kubectl apply -f -
      labctl k8s export --image registry.example.com/me/train:1 -- -m trainer
      labctl k8s run trainjob.yaml                                     # as Kubernetes would run it
      labctl k8s run --dry-run examples/kubernetes/trainjob.yaml       # what the lab takes, and does not
    """


@k8s.command("export", context_settings=SCRIPT_CONTEXT)
@lab_option
@click.option("--kind", type=click.Choice(MANIFEST_KINDS, case_sensitive=False), default="trainjob", show_default=True,
              help="trainjob: Kubeflow Trainer's TrainJob on its torch-distributed runtime; jobset: a JobSet of "
                   "indexed pods running torchrun.")
@click.option("-N", "--nodes", type=click.IntRange(1, 64), metavar="N", help="Nodes [default: the lab's].")
@nproc_option("Processes per node [default: the lab's].")
@click.option("--image", metavar="REGISTRY/NAME:TAG", help="Where you push the lab's node image [default: its local "
                                                           "name, which a cluster cannot pull].")
@click.option("--name", metavar="NAME", help="metadata.name [default: LAB-SCRIPT, e.g. ddplab-trainer].")
@env_options
@click.option("-o", "--out", "out", type=FilePath(dir_okay=False, path_type=Path), default=None,
              help="Where to write it; - for standard output [default: trainjob.yaml or jobset.yaml].")
@script_argument
def k8s_export(lab, kind, nodes, nproc_per_node, image, name, env_pairs, env_files, out, script) -> None:
    """Write the manifest of SCRIPT [ARGS...] (or `-m module [ARGS...]`) for a Kubernetes cluster.

    It runs what `labctl run` runs, torchrun with the same arguments, on the lab's nodes and
    processes, with -e/--env-file's variables; comments in the file say how to push the image and
    apply it, and what the lab has that the cluster will not. `labctl k8s run FILE` runs it here.
    """
    where = invocation()
    jobs = where.lab(lab).k8s
    env = build_user_env(env_pairs, env_files, where.environ)
    job = jobs.export_job(job_args(script, jobs.session.workspace, where.cwd), nodes=nodes,
                          nproc_per_node=check_nproc(nproc_per_node), image=image, name=name, env=env)
    path = jobs.export(kind.lower(), job, out or Path(f"{kind.lower()}.yaml"))
    if not is_stdout(path):
        info(f"wrote {path}: {job.nodes} node(s) x {job.nproc_per_node}, image {job.image}; "
             f"`kubectl apply -f {path.name}` on a cluster, `labctl k8s run {path.name}` here")


@k8s.command("run", context_settings=CONTEXT)
@lab_option
@click.argument("manifest", metavar="FILE", type=FilePath(path_type=Path))
@click.option("--ignore-image", is_flag=True, help="Run it even where the manifest's image has another torch than the "
                                                   "lab's (the lab's image runs either way).")
@click.option("--timeout-s", type=click.FloatRange(min=1), default=None, metavar="S",
              help="Stop the run after S seconds [default: the manifest's activeDeadlineSeconds, else none].")
@dry_run_option("Print what the lab takes from the manifest, what it cannot honour, and each node's command; run "
                "nothing.")
@json_option("Print the run as JSON, the document `labctl run --json` prints.")
def k8s_run(lab, manifest, ignore_image, timeout_s, dry_run, as_json) -> None:
    """Run a TrainJob or JobSet manifest FILE on the lab, as Kubernetes would run it.

    Pod i runs on node i: the manifest's command and args, its env, and for a TrainJob the PET_*
    variables Kubeflow's torch runtime sets; its CPU and memory limits are the nodes' for the run.
    The run ends as `labctl run` does: its output saved, the root cause named, its exit status.
    """
    the_lab = invocation().lab(lab)
    pods = the_lab.k8s.plan(manifest, ignore_image=ignore_image, timeout_s=timeout_s)
    if dry_run:
        render.print_pod_run(pods, the_lab.nodes().address)
        return
    render.print_pod_run(pods, None)
    render.finish_run(the_lab.k8s.run(pods, echo="stderr" if as_json else True, check=not as_json), as_json)
