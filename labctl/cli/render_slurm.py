"""Rendering `labctl slurm`'s results: node-prefixed lines, the job's verdict, its state."""

from __future__ import annotations

import json

from rich.markup import escape

from labctl.ui import console, err_console, error, info, node_colour


def print_line(node: str, line: str) -> None:
    """One line of the job: a node's, prefixed with its name, or Slurm's own (dimmed, on stderr)."""
    if node == "slurm":
        err_console.print(f"[dim]{escape(line)}[/dim]", soft_wrap=True)
        return
    index = int(node[4:]) if node[4:].isdigit() else 0
    colour = node_colour(index)
    console.print(f"[{colour}]{node:>8} |[/{colour}] {escape(line)}", soft_wrap=True)


def finish_run(result, as_json: bool) -> int:
    """Say how the job ended; the exit status for the shell (0, 1, or 130 after Ctrl-C)."""
    status = 0 if result.ok else (130 if result.interrupted else 1)
    if as_json:
        print(json.dumps({"ok": result.ok, "exit_status": status, "job_id": result.job_id,
                          "failed_node": result.failed_node, "failure": result.failure,
                          "run_dir": str(result.run_dir), "summary": result.summary}))
        return status
    job = f"job {result.job_id}" if result.job_id else "the job"
    if result.ok:
        loss = f", final_loss {result.summary['final_loss']}" if result.summary and "final_loss" in result.summary else ""
        survived = f" (elastic: it went on without {result.failed_node}: {result.failure})" if result.failed_node else ""
        info(f"{job} completed{survived}{loss}; logs: {result.run_dir}")
    elif result.interrupted:
        error(f"{job} cancelled (Ctrl-C): scancel sent, nothing of it runs", hint=f"logs: {result.run_dir}")
    elif result.failed_node:
        error(f"{job} failed on {result.failed_node}: {result.failure}",
              hint=f"its lines: {result.run_dir / (result.failed_node + '.log')}")
    else:
        error(f"{job} failed (exit status {result.exit_code})", hint=f"Slurm's lines: {result.run_dir / 'slurm.log'}")
    return status


def print_submitted(job, lab: str, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"job_id": job.job_id, "run_dir": str(job.run_dir), "output": str(job.output)}))
        return
    info(f"submitted job {job.job_id}; `labctl slurm status --lab {lab}` follows it, `labctl slurm logs --lab {lab} -f` "
         f"its output ({job.output})")


def print_status(state: dict[str, str], as_json: bool) -> None:
    if as_json:
        print(json.dumps(state))
        return
    for key, value in state.items():
        console.print(f"{key:>9}: {escape(value)}", soft_wrap=True)
