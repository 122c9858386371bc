"""Jobs on the lab's Slurm cluster (side effects): `labctl slurm run|submit|status|logs|cancel|export`.

Every Slurm command runs on the controller node (node0) through the engine, as the person running
labctl (the node itself runs as root, for the daemons), in the workspace, which every node has at
the same path: a job's output lands in .lab/<lab>/runs/<run id>/ as `labctl run`'s does.

- run: `salloc` holds the nodes and runs the job script (labctl.slurm.script) there, whose `srun`
  starts torchrun on each node. Output streams back with srun's task labels turned into node names
  and goes through the run's output streams as `labctl run`'s does (shown, saved as nodeN.log),
  and the job ends as a RunResult judged as every run is: the root cause's node, its error and its
  exit status, from the workers' own lines (srun names the first task to end, often a peer of the
  rank that failed). Ctrl-C cancels the job (`scancel`) and waits for it to go, so nothing keeps
  running.
- submit: `sbatch` of the same script; status reads `scontrol show job` (no accounting database:
  a finished job stays visible for MinJobAge), logs reads the job's output file, cancel `scancel`s.
"""

from __future__ import annotations

import json
import queue
import re
import shlex
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator

from labctl.core.outfile import is_stdout, write_text
from labctl.core.ui import node_colour
from labctl.engine.docker import exec_in, exec_user, lab_containers
from labctl.engine.labels import LABEL_SCHEDULER, container_name
from labctl.errors import ConfigError, LabError, StateError
from labctl.image.lockfile import hash_requirements, read_lab_lock
from labctl.image.packages import LOCK_FILE, TORCH
from labctl.run.executor import conclude, link_latest, save_result
from labctl.run.output import Echo, NodeLogs, OutputStream
from labctl.run.launch import PG_TIMEOUT_VAR, Launch, parse_nnodes, run_env, threads_per_process
from labctl.run.plan import new_run
from labctl.run.result import Outcome, RunResult
from labctl.session import LabSession
from labctl.slurm.cluster import CONTROLLER
from labctl.slurm.script import DEFAULT_TIME, LOCK_DIR_VAR, JobSpec, build_job_script, check_time

SCRIPT_FILE = "job.sbatch"  # in the run folder: the script the job ran, as `slurm export` writes it
JOB_FILE = "job.json"  # in the run folder: the job id and how it was started
LABEL_RE = re.compile(r"^(\d+): (.*)$")  # srun --label: "<task>: <line>"
# srun sends a task's output in messages of at most this many bytes and labels each one: a longer line
# comes as pieces of exactly this size, each on a line of its own (the trainer's SUMMARY, over 1,024 bytes
# for gpt, came in two). A piece of this size is joined with the task's next line.
SRUN_PIECE_BYTES = 1024
GRANTED_RE = re.compile(r"Granted job allocation (\d+)")
SRUN_ERROR_RE = re.compile(r"srun: error: (\S+): tasks? ([\d,-]+): (.+)")
SRUN_EXIT_RE = re.compile(r"Exited with exit code (\d+)")
NODE_FAILURE_RE = re.compile(r"(?:srun|salloc): error: Node failure on (\S+)")
ACTIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED")
CANCEL_WAIT_S = 20.0
PG_TIMEOUT_S = 30.0  # the trainer's collectives give up after this, as in `labctl run` (a lost peer never answers)


@dataclass(frozen=True)
class SubmittedJob:
    job_id: str
    run_dir: Path
    output: Path  # the job's output file (srun's labelled lines from every node)


class Slurm:
    """The Slurm side of a running lab brought up with `--scheduler slurm`."""

    def __init__(self, session: LabSession):
        self.session = session

    # ------------------------------------------------------------------------------ helpers

    def spec(self, args: list[str] | tuple[str, ...], nodes: int | None = None, nproc_per_node: int | None = None,
             time_limit: str | None = None, partition: str | None = None, account: str | None = None,
             nnodes: str | None = None, max_restarts: int = 0) -> JobSpec:
        """The job as the script states it; defaults from the lab (its nodes, its processes per node).
        `nnodes` MIN:MAX (MAX = the job's nodes) and `max_restarts` make it elastic."""
        count = nodes if nodes is not None else self._lab_nodes()
        if not 1 <= count <= 64:
            raise LabError(f"-N {count}: a job needs 1 to 64 nodes", hint="labctl slurm run -N 3 -- -m trainer")
        min_nodes = parse_nnodes(nnodes, count)[0] if nnodes is not None else None
        config = self.session.config
        return JobSpec(tuple(args), nodes=count, nproc_per_node=nproc_per_node or config.nproc_per_node,
                       time=check_time(DEFAULT_TIME if time_limit is None else time_limit), partition=partition,
                       account=account, iface=config.iface, port=config.master_port, min_nodes=min_nodes,
                       max_restarts=max_restarts)

    def _lab_nodes(self) -> int:
        """A job's nodes unless -N says: the running lab's count (a 2-node lab runs 2-node jobs), else
        the configured count (`slurm export` needs no lab, nor an engine)."""
        config = self.session.config
        if config.sources.get("nodes", "default") != "default":
            return config.nodes
        try:
            return len(self.session.status()) or config.nodes
        except StateError:
            return config.nodes

    def _require(self) -> list[str]:
        """The lab's node names; a StateError unless it is up as a Slurm cluster with the nodes asked for."""
        names = self.session.node_names()
        labels = [(c.get("Labels") or {}) for c in lab_containers(self.session.client, self.session.name)]
        if not any(label.get(LABEL_SCHEDULER) == "slurm" for label in labels):
            raise StateError(f"lab {self.session.name} is not a Slurm cluster",
                             hint=f"labctl up --lab {self.session.name} --scheduler slurm (it recreates the nodes)")
        return names

    def _exec(self, argv: list[str], env: dict[str, str] | None = None) -> tuple[int, str]:
        """argv on the controller, as the user, in the workspace: (exit code, output)."""
        client = self.session.client
        return exec_in(client, container_name(self.session.name, CONTROLLER), argv, env,
                       user=exec_user(client, self.session.name) or "", workdir=str(self.session.workspace))

    def _stream(self, argv: list[str], env: dict[str, str], lines: queue.Queue) -> threading.Thread:
        """Run argv on the controller in a thread, putting each output line on `lines`, then the exit code."""
        client = self.session.client
        api = client.api
        exec_id = api.exec_create(container_name(self.session.name, CONTROLLER), argv, environment=env,
                                  workdir=str(self.session.workspace),
                                  user=exec_user(client, self.session.name) or "")["Id"]

        def pump() -> None:
            pending = b""
            try:
                for chunk in api.exec_start(exec_id, stream=True):
                    pending += chunk
                    *complete, pending = pending.split(b"\n")
                    for line in complete:
                        lines.put(line.decode(errors="replace"))
                if pending:
                    lines.put(pending.decode(errors="replace"))
            finally:
                lines.put(api.exec_inspect(exec_id)["ExitCode"])

        thread = threading.Thread(target=pump, daemon=True)
        thread.start()
        return thread

    def _write_script(self, spec: JobSpec) -> tuple[str, Path, Path]:
        run_id, run_dir = new_run(self.session.directory)
        run_dir.mkdir(parents=True)
        script = run_dir / SCRIPT_FILE
        script.write_text(build_job_script(replace(spec, packages=self._write_lock(run_dir, SCRIPT_FILE))))
        return run_id, run_dir, script

    def _write_lock(self, folder: Path, script: str) -> str | None:
        """The lab's lock beside a job script: pylock.<name>.toml as it is, and <name>.requirements.txt in
        pip's hash-checking form without torch (the cluster's own); the latter's name, or None without a lock."""
        lock_path = self.session.directory / LOCK_FILE
        lock = read_lab_lock(lock_path)
        if lock is None:
            return None
        stem = Path(script).stem
        write_text(folder / f"pylock.{stem}.toml", lock_path.read_text())
        name = f"{stem}.requirements.txt"
        write_text(folder / name, hash_requirements(p for p in lock.pins if p.name != TORCH))
        return name

    def _job_env(self, spec: JobSpec, run_id: str, run_dir: Path) -> dict[str, str]:
        """What the job's processes get besides the script's own: the run's folder, and threads that
        share the machine's CPUs out as `labctl run` does (srun passes the environment on)."""
        threads = threads_per_process(self.session.cpus, spec.nodes, spec.nproc_per_node)
        return {**run_env(run_id, run_dir), "OMP_NUM_THREADS": str(threads), PG_TIMEOUT_VAR: f"{PG_TIMEOUT_S:g}",
                LOCK_DIR_VAR: str(run_dir)}

    # ------------------------------------------------------------------------------ commands

    def export(self, spec: JobSpec, path: Path) -> list[Path]:
        """Write the job script for a real cluster (`-`: to standard output), and beside it the lab's
        lock where it has one (_write_lock: not with `-`); needs no running lab. Returns what it wrote:
        the script, then the lock's files."""
        if not is_stdout(path):
            spec = replace(spec, packages=self._write_lock(path.parent, path.name))
        text = build_job_script(spec)
        try:
            write_text(path, text, mode=0o755)
        except OSError as exc:
            raise ConfigError("--out", str(path), f"must be a file that can be written ({exc.strerror})",
                              hint="labctl slurm export -o train.sbatch -- -m trainer") from None
        lock = [path.parent / f"pylock.{path.stem}.toml", path.parent / spec.packages] if spec.packages else []
        return [path, *lock]

    def run(self, spec: JobSpec, *, echo: bool | str = True, check: bool = True) -> RunResult:
        """salloc + the job script, streamed as `labctl run` streams (echo: True, "stderr" or False),
        saved and judged as `labctl run` saves and judges: the same RunResult. `check` raises
        RunFailed, with the root cause's exit status, unless the job succeeded."""
        names = self._require()
        if spec.nodes > len(names):
            raise LabError(f"-N {spec.nodes}: lab {self.session.name} has {len(names)} nodes",
                           hint=f"labctl up --lab {self.session.name} --nodes {spec.nodes}, or a smaller -N")
        run_id, run_dir, script = self._write_script(spec)
        argv = ["salloc", f"--nodes={spec.nodes}", "--ntasks-per-node=1", f"--time={spec.time}",
                f"--job-name={spec.job_name}", *(["--no-kill"] if spec.elastic else []), "bash", str(script)]
        (run_dir / JOB_FILE).write_text(json.dumps({"how": "salloc", "argv": shlex.join(argv)}))
        link_latest(run_dir)
        lines: queue.Queue = queue.Queue()
        self._stream(argv, self._job_env(spec, run_id, run_dir), lines)
        output = JobOutput(run_dir, names[:spec.nodes], Echo(echo) if echo else None)
        interrupted = False
        try:
            code = output.drain(lines)
        except KeyboardInterrupt:
            interrupted = True
            self._cancel_quietly(output.job_id)
            code = output.drain(lines, timeout_s=CANCEL_WAIT_S)
        result = output.result(code, argv, interrupted=interrupted, min_nodes=spec.min_nodes)
        save_result(result)
        (run_dir / JOB_FILE).write_text(json.dumps({"how": "salloc", "job_id": output.job_id, "argv": shlex.join(argv)}))
        return conclude(result, echo, check)

    def submit(self, spec: JobSpec) -> SubmittedJob:
        names = self._require()
        if spec.nodes > len(names):
            raise LabError(f"-N {spec.nodes}: lab {self.session.name} has {len(names)} nodes",
                           hint=f"labctl up --lab {self.session.name} --nodes {spec.nodes}, or a smaller -N")
        run_id, run_dir, script = self._write_script(spec)
        output = run_dir / "slurm-%j.out"
        argv = ["sbatch", "--parsable", f"--output={output}", f"--nodes={spec.nodes}", f"--time={spec.time}",
                str(script)]
        env = {"SBATCH_EXPORT": "ALL", **self._job_env(spec, run_id, run_dir)}
        code, text = self._exec(argv, env)
        job_id = text.strip().split(";")[0]
        if code != 0 or not job_id.isdigit():
            raise StateError(f"sbatch refused the job: {text.strip()[-300:]}",
                             hint=f"labctl doctor --lab {self.session.name} checks the Slurm cluster")
        (run_dir / JOB_FILE).write_text(json.dumps({"how": "sbatch", "job_id": job_id, "argv": shlex.join(argv)}))
        link_latest(run_dir)
        return SubmittedJob(job_id, run_dir, run_dir / f"slurm-{job_id}.out")

    def status(self, job_id: str | None = None) -> dict[str, str]:
        """scontrol's view of the job (default: the latest submitted): JobState, ExitCode, NodeList, ..."""
        self._require()
        job = job_id or self.latest_job()[0]
        code, text = self._exec(["scontrol", "show", "job", "--oneliner", job])
        if code != 0:
            raise StateError(f"Slurm knows no job {job} ({text.strip()[-200:]})",
                             hint="a finished job is forgotten after an hour; `labctl slurm logs JOB` still reads its output")
        fields = dict(item.split("=", 1) for item in shlex.split(text) if "=" in item)
        return {k: fields.get(k, "") for k in ("JobId", "JobName", "JobState", "Reason", "ExitCode", "RunTime",
                                               "NumNodes", "NodeList", "StdOut")}

    def latest_job(self) -> tuple[str, Path]:
        """(job id, run folder) of the latest `slurm submit` in this lab's folder."""
        runs = sorted((p for p in (self.session.directory / "runs").glob(f"*/{JOB_FILE}")), key=lambda p: p.stat().st_mtime)
        for path in reversed(runs):
            job = json.loads(path.read_text()).get("job_id")
            if job:
                return job, path.parent
        raise LabError(f"no job submitted in lab {self.session.name} yet",
                       hint="labctl slurm submit -- -m trainer")

    def output_of(self, job_id: str | None = None) -> Path:
        """The output file of a submitted job (default: the latest)."""
        if job_id is None:
            job_id, run_dir = self.latest_job()
        else:
            found = [p.parent for p in (self.session.directory / "runs").glob(f"*/{JOB_FILE}")
                     if json.loads(p.read_text()).get("job_id") == str(job_id)]
            if not found:
                raise LabError(f"no job {job_id} was submitted from lab {self.session.name}",
                               hint="`labctl slurm status` shows the latest")
            run_dir = found[0]
        return run_dir / f"slurm-{job_id}.out"

    def output(self, job_id: str | None = None, follow: bool = False, poll_s: float = 0.5) -> Iterator[str]:
        """The job's output so far; with `follow`, then what it adds, until Slurm has ended the job."""
        path = self.output_of(job_id)
        job = job_id or self.latest_job()[0]
        shown = 0
        while True:
            active = follow and self.status(job)["JobState"] in ACTIVE  # asked before reading: nothing is missed
            text = path.read_text(errors="replace") if path.exists() else ""
            if text[shown:]:
                yield text[shown:]
            shown = len(text)
            if not active:
                return
            time.sleep(poll_s)

    def cancel(self, job_id: str | None = None) -> dict[str, str]:
        """scancel the job (default: the latest submitted) and wait until Slurm has ended it."""
        self._require()
        job = job_id or self.latest_job()[0]
        code, text = self._exec(["scancel", job])
        if code != 0:
            raise StateError(f"scancel {job} failed: {text.strip()[-200:]}")
        return self.wait(job, CANCEL_WAIT_S)

    def wait(self, job_id: str, timeout_s: float, poll_s: float = 0.5) -> dict[str, str]:
        """Poll scontrol (not `sbatch --wait`, which polls every few tens of seconds) until the job ends."""
        deadline = time.monotonic() + timeout_s
        state = self.status(job_id)
        while state["JobState"] in ACTIVE and time.monotonic() < deadline:
            time.sleep(poll_s)
            state = self.status(job_id)
        return state

    def _cancel_quietly(self, job_id: str | None) -> None:
        if job_id:
            try:
                self._exec(["scancel", job_id])
            except Exception:  # noqa: BLE001 - Ctrl-C clean-up: salloc ending also releases the job
                pass


class JobOutput:
    """salloc's output as it comes: each node's lines (srun --label) through the run's OutputStream
    for that node, as `labctl run` writes and shows them; Slurm's own lines (salloc's, srun's) to
    slurm.log and, dimmed, to stderr; what Slurm says of each task and node, for the verdict."""

    def __init__(self, run_dir: Path, nodes: list[str], echo: Echo | None):
        self.nodes, self.echo = nodes, echo
        self.logs = NodeLogs(run_dir)
        self.run_dir = run_dir
        self.streams = [OutputStream(Outcome(Launch(node, node, ["torchrun"])), self.logs, node_colour(i), echo)
                        for i, node in enumerate(nodes)]
        self.slurm: list[str] = []  # salloc's and srun's own lines, and the script's echo
        self.job_id: str | None = None
        self.srun: dict[str, tuple[int | None, bool]] = {}  # node -> (its task's exit code, terminated by srun)
        self.lost: set[str] = set()  # nodes Slurm reported failed
        self.pieces: dict[int, str] = {}  # task -> the start of a line srun cut into pieces (SRUN_PIECE_BYTES)

    def drain(self, lines: queue.Queue, timeout_s: float | None = None) -> int | None:
        deadline = time.monotonic() + timeout_s if timeout_s else None
        while True:
            wait = 0.2 if deadline is None else max(0.0, min(0.2, deadline - time.monotonic()))
            try:
                item = lines.get(timeout=wait)
            except queue.Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    return None
                continue
            if isinstance(item, int):
                for task in list(self.pieces):  # a last piece with nothing after it is a line as it is
                    self.streams[task].line(self.pieces.pop(task))
                return item
            self.feed(item)

    def feed(self, line: str) -> None:
        labelled = LABEL_RE.match(line)
        if labelled and int(labelled.group(1)) < len(self.streams):  # one task per node, in node order
            task, piece = int(labelled.group(1)), labelled.group(2)
            text = self.pieces.pop(task, "") + piece
            if len(piece.encode()) == SRUN_PIECE_BYTES:
                self.pieces[task] = text
            else:
                self.streams[task].line(text)
            return
        self.slurm.append(line)
        self.logs.write("slurm", line + "\n")
        if self.echo and self.echo.on:
            self.echo.note(line)
        granted = GRANTED_RE.search(line)
        if granted and self.job_id is None:
            self.job_id = granted.group(1)
        failed = SRUN_ERROR_RE.search(line)
        if failed and failed.group(1) not in self.srun:
            code = SRUN_EXIT_RE.search(failed.group(3))
            self.srun[failed.group(1)] = (int(code.group(1)) if code else None, "Terminated" in failed.group(3))
        lost = NODE_FAILURE_RE.search(line)
        if lost and lost.group(1) in self.nodes and lost.group(1) not in self.lost:
            self.lost.add(lost.group(1))
            # said as labctl says a lost node, so the verdict reads it as it reads `labctl run`'s
            self.streams[self.nodes.index(lost.group(1))].line(
                f"labctl: {lost.group(1)} went down (Slurm: Node failure): node lost")

    def result(self, code: int | None, argv: list[str], *, interrupted: bool, min_nodes: int | None) -> RunResult:
        """The run as labctl.run.result judges every run. A node's status is its srun task's (torchrun's);
        a job that failed with no task failing (an allocation refused, srun unable to start) is
        salloc's failure, from Slurm's own lines."""
        for stream in self.streams:
            node = stream.outcome.launch.node
            # a node Slurm lost has no status of its own: 255, as labctl says of a node it lost
            otherwise = 255 if node in self.lost else 0 if code == 0 or stream.outcome.lines else None
            status, terminated = self.srun.get(node, (otherwise, False))
            stream.outcome.stopped = terminated
            stream.end(None if terminated else status)
        outcomes = [stream.outcome for stream in self.streams]
        self.logs.close()
        job_failed = code != 0 and not interrupted
        if job_failed and all(o.exit_code in (0, None) for o in outcomes) and not any(o.stopped for o in outcomes):
            # Slurm's lines without the program's name ("salloc: error: ..."), so its error reads as one
            said = [line.split(": ", 1)[1] if line.startswith(("salloc: ", "srun: ")) else line for line in self.slurm]
            salloc = Outcome(Launch("slurm", "slurm", argv), code if code is not None else 1, lines=said)
            salloc.ended, salloc.ended_at = time.monotonic(), time.time()
            outcomes.append(salloc)
        first = next((o for o in outcomes if o.exit_code not in (0, None)), None)
        return RunResult(self.run_dir, outcomes, first, interrupted=interrupted, min_nodes=min_nodes)
