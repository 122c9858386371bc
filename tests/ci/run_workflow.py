#!/usr/bin/env python3
"""Run one job of a GitHub Actions workflow on this machine, step by step, as a GitHub runner would.

Our machines have no GitHub runner, and `act` (which runs a job inside a runner image pulled from
Docker Hub) cannot work where no container registry answers. So this script runs the job on the
host itself, in a fresh clone of the repository:

- `run:` steps in bash (`bash -e {0}`; `shell: bash` as `bash --noprofile --norc -eo pipefail {0}`;
  `sh` and `python` too), in the workspace or the step's working-directory, with the runner's
  variables (CI, GITHUB_ACTIONS, GITHUB_WORKSPACE, GITHUB_SHA, RUNNER_TEMP, RUNNER_OS, GITHUB_OUTPUT,
  GITHUB_ENV, GITHUB_PATH, ...) and the workflow's, the job's and the step's `env:`;
- `uses:` steps by their local equivalents:
    actions/checkout            `git clone` of --repo, checked out at its HEAD commit (what is committed)
    actions/setup-python        the interpreter python-version names (a pyenv one too) as a fresh venv,
                                first on PATH: a runner's Python starts as empty as that
    actions/cache, /restore, /save   a folder per key under --cache-dir (restore-keys by prefix, newest
                                first); actions/cache saves in a post step when the job succeeded
    actions/upload-artifact     copies of the matching files in --artifacts/NAME/, by their paths in
                                the workspace (hidden files only with include-hidden-files: true)
- expressions: see gha_expr.py; contexts github (workspace, sha, ref_name, repository, run_id,
  run_attempt, job, event_name), runner (os, arch, temp, tool_cache), env, steps.ID.outputs/outcome/
  conclusion; `if:` with success() failure() always() cancelled().

A job's environment is this process's environment less PYTHONPATH, PYTHONHOME and VIRTUAL_ENV (a
runner's has none), with XDG_CACHE_HOME set to an empty folder, as a fresh runner's ~/.cache is.
Not supported (refused, exit 2): other actions, matrices, services, container jobs, reusable
workflows, `needs`, secrets in expressions.

    python tests/ci/run_workflow.py examples/ci/ddplab.yml --env 'DDPLAB_SPEC=${{ github.workspace }}'

Exit status: 0 the job succeeded, 1 it failed, 2 this script cannot run the workflow as given.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gha_expr import ExpressionError, condition, substitute  # noqa: E402
from gha_actions import ACTIONS, Job, UnsupportedError  # noqa: E402

SHELLS = {None: "bash -e {0}", "bash": "bash --noprofile --norc -eo pipefail {0}", "sh": "sh -e {0}",
          "python": "python {0}"}
DROPPED_ENV = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")


def parse_env_file(text: str) -> dict[str, str]:
    """GITHUB_OUTPUT / GITHUB_ENV: `NAME=value` lines and `NAME<<DELIMITER` ... `DELIMITER` blocks."""
    values, lines = {}, text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.strip():
            continue
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delimiter = line.split("<<", 1)
            block = []
            while i < len(lines) and lines[i] != delimiter:
                block.append(lines[i])
                i += 1
            if i >= len(lines):
                raise UnsupportedError(f"{name}<<{delimiter} is never closed by a line {delimiter!r}")
            i += 1
            values[name] = "\n".join(block)
        elif "=" in line:
            name, value = line.split("=", 1)
            values[name] = value
        else:
            raise UnsupportedError(f"cannot read the line {line!r}: expected NAME=value or NAME<<DELIMITER")
    return values


def load_job(path: Path, job_id: str | None) -> tuple[dict, str, dict]:
    try:
        workflow = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise UnsupportedError(f"cannot read {path}: {exc}") from None
    jobs = (workflow or {}).get("jobs") or {}
    if not jobs:
        raise UnsupportedError(f"{path} has no jobs")
    if job_id is None:
        if len(jobs) != 1:
            raise UnsupportedError(f"{path} has jobs {', '.join(jobs)}: name one with --job")
        job_id = next(iter(jobs))
    if job_id not in jobs:
        raise UnsupportedError(f"{path} has no job {job_id!r} (jobs: {', '.join(jobs)})")
    job = jobs[job_id]
    for key in ("strategy", "services", "container", "needs", "uses"):
        if key in job:
            raise UnsupportedError(f"job {job_id} uses {key}:, which this script does not run")
    return workflow, job_id, job


class Runner:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.workflow, self.job_id, self.job = load_job(Path(args.workflow), args.job)  # before any folder is made
        self.repo = Path(args.repo).resolve()
        self.sha = subprocess.run(["git", "-C", str(self.repo), "rev-parse", args.ref], capture_output=True,
                                  text=True, check=True).stdout.strip()
        self.work = Path(args.work or tempfile.mkdtemp(prefix="run-workflow-")).resolve()
        self.workspace = self.work / "workspace" / self.repo.name
        self.temp = self.work / "temp"
        for folder in (self.workspace, self.temp, self.work / "tool-cache", self.work / "xdg-cache"):
            folder.mkdir(parents=True, exist_ok=True)
        self.path_entries: list[str] = []
        self.failed = False
        self.steps: dict[str, dict] = {}
        self.post: list = []
        self.report: list[tuple[str, str, float]] = []
        self.run_id = str(int(time.time()))

    def contexts(self, env: dict) -> dict:
        github = {"workspace": str(self.workspace), "sha": self.sha, "ref_name": self.args.ref, "job": self.job_id,
                  "repository": f"local/{self.repo.name}", "run_id": self.run_id, "run_attempt": "1",
                  "event_name": "push"}
        runner = {"os": "Linux", "arch": "X64", "temp": str(self.temp), "tool_cache": str(self.work / "tool-cache")}
        return {"github": github, "runner": runner, "env": env, "steps": self.steps}

    def base_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
        env.update(CI="true", GITHUB_ACTIONS="true", GITHUB_WORKSPACE=str(self.workspace), GITHUB_SHA=self.sha,
                   GITHUB_REF_NAME=self.args.ref, GITHUB_JOB=self.job_id, RUNNER_OS="Linux", RUNNER_ARCH="X64",
                   RUNNER_TEMP=str(self.temp), RUNNER_TOOL_CACHE=str(self.work / "tool-cache"),
                   XDG_CACHE_HOME=str(self.work / "xdg-cache"))
        return env

    def run(self) -> int:
        workflow, job = self.workflow, self.job
        env = {}
        for layer in (workflow.get("env") or {}, job.get("env") or {}):
            for key, value in layer.items():
                env[key] = substitute(str(value), self.contexts(env))
        for pair in self.args.env:
            key, _, value = pair.partition("=")
            env[key] = substitute(value, self.contexts(env))
        self.job_env = env
        shell = ((job.get("defaults") or workflow.get("defaults") or {}).get("run") or {}).get("shell")
        deadline = time.monotonic() + 60 * float(job.get("timeout-minutes", 360))
        for number, step in enumerate(job.get("steps") or [], 1):
            self.run_step(number, step, shell, deadline)
        for name, if_text, action in reversed(self.post):
            self.execute(f"Post {name}", action, None, if_text)
        self.print_report()
        return 1 if self.failed else 0

    def run_step(self, number: int, step: dict, default_shell: str | None, deadline: float) -> None:
        name = step.get("name") or step.get("uses") or (step.get("run") or "").splitlines()[0][:60]
        label = f"{number}. {name}"
        step_env = dict(self.job_env)
        for key, value in (step.get("env") or {}).items():
            step_env[key] = substitute(str(value), self.contexts(step_env))
        if "uses" in step:
            action = ACTIONS.get(step["uses"].split("@")[0])
            if action is None:
                raise UnsupportedError(f"step {label}: {step['uses']} has no local equivalent here (known: "
                                       f"{', '.join(sorted(ACTIONS))})")
            job = Job(self.repo, self.sha, self.workspace, self.temp, self.work, self.args, self.path_entries,
                      self.post, step_env)

            def body():
                inputs = {k: substitute(str(v), self.contexts(step_env)) for k, v in (step.get("with") or {}).items()}
                return action(job, inputs, name)
        else:
            def body():
                script = substitute(step["run"], self.contexts(step_env))
                return self.shell(script, step.get("shell") or default_shell, step, step_env, deadline)
        self.execute(label, body, step.get("id"), step.get("if"), step_env, bool(step.get("continue-on-error")))

    def execute(self, label, body, step_id, if_text, env=None, continue_on_error=False) -> None:
        if not condition(if_text, self.contexts(env or self.job_env), self.failed):
            self.report.append((label, "skipped", 0.0))
            if step_id:
                self.steps[step_id] = {"outputs": {}, "outcome": "skipped", "conclusion": "skipped"}
            print(f"\n=== {label}: skipped (if: {if_text or 'success()'})", flush=True)
            return
        print(f"\n=== {label}", flush=True)
        started = time.monotonic()
        try:
            ok, outputs = body()
        except (UnsupportedError, ExpressionError):
            raise  # the workflow asks for what this script cannot do: exit 2, not a failed step
        except Exception as exc:  # noqa: BLE001 - a step that breaks is a failed step, as on a runner
            print(f"error: {exc}", file=sys.stderr)
            ok, outputs = False, {}
        outcome = "success" if ok else "failure"
        if step_id:
            self.steps[step_id] = {"outputs": outputs, "outcome": outcome,
                                   "conclusion": "success" if continue_on_error else outcome}
        if not ok and not continue_on_error:
            self.failed = True
        self.report.append((label, outcome, time.monotonic() - started))

    def shell(self, script: str, shell: str | None, step: dict, env: dict, deadline: float) -> tuple[bool, dict]:
        if shell not in SHELLS:
            raise UnsupportedError(f"shell {shell!r} is not supported (known: bash, sh, python)")
        files = {name: self.temp / f"{name.lower()}-{time.monotonic_ns()}" for name in
                 ("GITHUB_OUTPUT", "GITHUB_ENV", "GITHUB_PATH", "GITHUB_STEP_SUMMARY")}
        for path in files.values():
            path.write_text("")
        script_file = self.temp / f"step-{time.monotonic_ns()}.sh"
        script_file.write_text(script)
        run_env = {**self.base_env(), **env, **{k: str(v) for k, v in files.items()}}
        run_env["PATH"] = os.pathsep.join([*self.path_entries, run_env.get("PATH", "")])
        argv = [part.replace("{0}", str(script_file)) for part in SHELLS[shell].split()]
        cwd = self.workspace / step.get("working-directory", ".")
        limit = min(deadline, time.monotonic() + 60 * float(step.get("timeout-minutes", 360))) - time.monotonic()
        proc = subprocess.Popen(argv, cwd=cwd, env=run_env, start_new_session=True)
        try:
            code = proc.wait(timeout=max(1.0, limit))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            print(f"error: the step ran past its time limit ({limit:.0f} s left)", file=sys.stderr)
            code = 124
        for key, value in parse_env_file(files["GITHUB_ENV"].read_text()).items():
            self.job_env[key] = value
        self.path_entries[:0] = [line for line in files["GITHUB_PATH"].read_text().splitlines() if line.strip()]
        if code != 0:
            print(f"error: process completed with exit code {code}", file=sys.stderr)
        return code == 0, parse_env_file(files["GITHUB_OUTPUT"].read_text())

    def print_report(self) -> None:
        print(f"\n=== job {self.job_id}: {'failure' if self.failed else 'success'}")
        for label, outcome, seconds in self.report:
            print(f"  {outcome:<8} {seconds:7.1f} s  {label}")
        summary = {"job": self.job_id, "result": "failure" if self.failed else "success",
                   "steps": [{"step": label, "outcome": outcome, "seconds": round(seconds, 1)}
                             for label, outcome, seconds in self.report],
                   "outputs": {sid: s["outputs"] for sid, s in self.steps.items()}, "workspace": str(self.workspace)}
        (self.work / "result.json").write_text(json.dumps(summary, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workflow", help="the workflow file (YAML)")
    parser.add_argument("--repo", default=".", help="the repository actions/checkout clones (default: .)")
    parser.add_argument("--ref", default="HEAD", help="the commit it checks out (default: HEAD)")
    parser.add_argument("--job", help="the job to run (default: the workflow's only one)")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="set or override a job env: value (expressions allowed, e.g. ${{ github.workspace }})")
    parser.add_argument("--work", help="folder for the workspace, temp, tool cache (default: a new temp folder)")
    parser.add_argument("--cache-dir", help="where actions/cache keeps its entries (default: WORK/actions-cache)")
    parser.add_argument("--artifacts", help="where upload-artifact copies files (default: WORK/artifacts)")
    args = parser.parse_args(argv)
    for pair in args.env:
        if "=" not in pair or not pair.split("=", 1)[0]:
            parser.error(f"--env {pair!r}: expected KEY=VALUE")
    try:
        runner = Runner(args)
        print(f"workspace: {runner.workspace}", flush=True)
        return runner.run()
    except (UnsupportedError, ExpressionError) as exc:
        print(f"run_workflow: {exc}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as exc:
        print(f"run_workflow: {' '.join(exc.cmd)} failed: {(exc.stderr or '').strip()}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
