"""The lab as a Slurm cluster: `labctl slurm run|submit|status|logs|cancel|export`."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import click

from labctl.api.inputs import job_args
from labctl.cli.app import CONTEXT, invocation, main
from labctl.cli.lazy import render, render_slurm
from labctl.cli.options import FilePath, SCRIPT_CONTEXT, json_option, lab_option, script_argument
from labctl.core.outfile import is_stdout
from labctl.core.ui import info


def job_options(f):
    """What a job asks Slurm for: the options `run`, `submit` and `export` share."""
    f = click.option("--max-restarts", type=click.IntRange(0, 100), default=0, show_default=True, metavar="K",
                     help="torchrun restarts every worker up to K times after a failure (resuming from a checkpoint).")(f)
    f = click.option("--nnodes", metavar="MIN:MAX", help="Elastic: MAX = the job's nodes; it goes on with MIN "
                                                         "survivors (the job and its step survive a lost node).")(f)
    f = click.option("--time", "time_limit", metavar="T", help="Time limit, as sbatch takes it: 30, 00:30:00, 1-00:00:00 "
                                                               "[default 00:30:00].")(f)
    f = click.option("--ntasks-per-node", "nproc_per_node", type=click.IntRange(1, 32), metavar="P",
                     help="Processes per node, one per GPU on GPU nodes (torchrun's --nproc-per-node: Slurm runs one "
                          "task per node, torchrun starts the P processes) [default: the lab's].")(f)
    return click.option("-N", "--nodes", type=click.IntRange(1, 64), metavar="N",
                        help="Nodes for the job [default: all of the lab's].")(f)


@dataclass(frozen=True)
class JobRequest:
    """What a job asks Slurm for, as the options of `job_options` (and export's own) give it; None: the
    lab's, or Slurm's, default."""

    nodes: int | None  # -N/--nodes
    nproc_per_node: int | None  # --ntasks-per-node
    time_limit: str | None  # --time
    nnodes: str | None  # --nnodes MIN:MAX (elastic)
    max_restarts: int  # --max-restarts
    partition: str | None = None  # --partition (export)
    account: str | None = None  # --account (export)


def lab_and_spec(lab, script, request: JobRequest):
    """The lab's Slurm side and the job `request` describes, SCRIPT taken from where you stand."""
    where = invocation()
    jobs = where.lab(lab).slurm
    spec = jobs.spec(job_args(script, jobs.session.workspace, where.cwd), request.nodes, request.nproc_per_node,
                     request.time_limit, request.partition, request.account, nnodes=request.nnodes,
                     max_restarts=request.max_restarts)
    return jobs, spec


@main.group(context_settings=CONTEXT)
def slurm() -> None:
    """Jobs on the lab as a Slurm cluster (`labctl up --scheduler slurm`), and the script for a real one.

    \b
    Examples:
      labctl up --nodes 3 --scheduler slurm
      labctl slurm run -N 3 -- -m trainer --workload gpt --steps 50
      labctl slurm submit -- -m trainer && labctl slurm status && labctl slurm logs -f
      labctl slurm export -o train.sbatch -- -m trainer --workload gpt   # take it to your cluster
    """


@slurm.command("run", context_settings=SCRIPT_CONTEXT)
@lab_option
@job_options
@json_option("Print the run as JSON, the document `labctl run --json` prints (exit status, each node, the root "
             "cause, the trainer's SUMMARY).")
@script_argument
def slurm_run(lab, nodes, nproc_per_node, time_limit, nnodes, max_restarts, as_json, script) -> None:
    """Run SCRIPT [ARGS...] (or `-m module [ARGS...]`) as a Slurm job, and stream it.

    salloc holds the nodes and runs the job script that `slurm export` writes; its srun starts
    torchrun on each node. Output is prefixed with the node's name and saved under
    .lab/<lab>/runs/. A failing rank ends the job on every node; the last lines name it, and
    labctl exits with its status, as `labctl run` does. Ctrl-C cancels the job.
    """
    jobs, spec = lab_and_spec(lab, script, JobRequest(nodes, nproc_per_node, time_limit, nnodes, max_restarts))
    render.finish_run(jobs.run(spec, echo="stderr" if as_json else True, check=not as_json), as_json)


@slurm.command("submit", context_settings=SCRIPT_CONTEXT)
@lab_option
@job_options
@json_option('Print {"job_id", "run_dir", "output"}.')
@script_argument
def slurm_submit(lab, nodes, nproc_per_node, time_limit, nnodes, max_restarts, as_json, script) -> None:
    """Queue SCRIPT [ARGS...] as a batch job (sbatch of the script `slurm export` writes)."""
    jobs, spec = lab_and_spec(lab, script, JobRequest(nodes, nproc_per_node, time_limit, nnodes, max_restarts))
    render_slurm.print_submitted(jobs.submit(spec), jobs.session.name, as_json)


@slurm.command("status", context_settings=CONTEXT)
@lab_option
@click.argument("job", required=False)
@json_option("Print Slurm's fields as JSON.")
def slurm_status(lab, job, as_json) -> None:
    """The state of JOB (default: the latest submitted) as Slurm's controller has it."""
    render_slurm.print_status(invocation().lab(lab).slurm.status(job), as_json)


@slurm.command("logs", context_settings=CONTEXT)
@lab_option
@click.argument("job", required=False)
@click.option("-f", "--follow", is_flag=True, help="Follow the output until the job has ended.")
def slurm_logs(lab, job, follow) -> None:
    """The output of JOB (default: the latest submitted): every node's lines, labelled with srun's task."""
    for text in invocation().lab(lab).slurm.output(job, follow=follow):
        sys.stdout.write(text)
        sys.stdout.flush()


@slurm.command("cancel", context_settings=CONTEXT)
@lab_option
@click.argument("job", required=False)
def slurm_cancel(lab, job) -> None:
    """Cancel JOB (default: the latest submitted) and wait until Slurm has ended it."""
    state = invocation().lab(lab).slurm.cancel(job)
    info(f"job {state['JobId']}: {state['JobState']}")


@slurm.command("export", context_settings=SCRIPT_CONTEXT)
@lab_option
@job_options
@click.option("--partition", metavar="NAME", help="Your cluster's partition (#SBATCH --partition).")
@click.option("--account", metavar="NAME", help="Your cluster's account (#SBATCH --account).")
@click.option("-o", "--out", "out", type=FilePath(dir_okay=False, path_type=Path), default=Path("job.sbatch"),
              show_default=True, help="Where to write the script; - for standard output.")
@script_argument
def slurm_export(lab, nodes, nproc_per_node, time_limit, nnodes, max_restarts, partition, account, out, script) -> None:
    """Write the sbatch script for SCRIPT [ARGS...] to take to a real Slurm cluster.

    It is the script `slurm submit` and `slurm run` run in the lab: the nodes, the rendezvous and
    the node that hosts it all come from Slurm's variables; comments say what to change. A lab with
    packages (`up --requirements/--with`) also gets its lock written beside the script, and the
    lines that install it into the job's environment.
    """
    request = JobRequest(nodes, nproc_per_node, time_limit, nnodes, max_restarts, partition, account)
    jobs, spec = lab_and_spec(lab, script, request)
    path, *lock = jobs.export(spec, out)
    if not is_stdout(path):
        info(f"wrote {path}: `sbatch {path.name}` on the cluster's login node, from your project's folder")
    if lock:
        info(f"wrote the lab's lock beside it ({', '.join(p.name for p in lock)}): the job installs the same "
             "packages into its environment, each wheel checked against the lock")
