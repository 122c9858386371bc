"""Rendering `labctl slurm`'s results: a submitted job, its state. (`slurm run` ends as `labctl run` does:
labctl.cli.render.finish_run.)"""

from __future__ import annotations

import json

from rich.markup import escape

from labctl.core.ui import console, info


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
