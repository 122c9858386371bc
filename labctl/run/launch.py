"""What each node runs for `labctl run`: launcher argv and environment. Pure: returns data.

torchrun: the node's env file already carries PET_* defaults, so the command is the bare
`torchrun SCRIPT ARGS`. Per run we only override the rendezvous id (a fresh one each run) and the
store host (see `store_launch` and labctl/remote/store.py).

static: the manual style people use on VMs: RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT exported by hand and plain `python SCRIPT ARGS`, one process per rank.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Collection, Mapping, Sequence

from labctl import remote
from labctl.errors import ConfigError, LabError
from labctl.run.userenv import check_user_env

# Written out again in labctl/remote's scripts, which tests/unit/test_remote.py holds to these.
RUN_ID_VAR = "DDPLAB_RUN_ID"  # every process of a run inherits it; `stop` finds them by it
RUN_DIR_VAR = "DDPLAB_RUN_DIR"  # where the trainer writes its per-rank metrics
STORE_READY = "DDPLAB_STORE_READY"
STORE_FAILED = "DDPLAB_STORE_FAILED"

# The programs a run ships to its nodes as `python -c TEXT ...`, from labctl/remote/:
STORE_SCRIPT = remote.load("store.py")  # the run's rendezvous store on node0: TEXT PORT; see store_launch
PORT_CHECK_SCRIPT = remote.load("port_check.py")  # is the rendezvous port free? TEXT PORT: exit 0, or 3 and why
# TEXT stop RUN_ID GRACE_S stops a run's processes on a node (by DDPLAB_RUN_ID, SIGTERM then SIGKILL);
# TEXT watch GRACE_S ARGV... runs a launch on a real host and stops its run when the SSH session closes.
STOP_SCRIPT = remote.load("stop.py")


@dataclass(frozen=True)
class Launch:
    """One process tree to start on one node (which `executor.Nodes` reaches, by the node's name)."""

    label: str  # the output prefix, e.g. node1 or node1/r3
    node: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None

    def display(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        return f"{env} {shlex.join(self.argv)}".strip()


def parse_script_args(args: list[str], known_options: Collection[str] | None = None,
                      command: str = "labctl run") -> list[str]:
    """torchrun's positional form: `SCRIPT [ARGS...]` or `-m MODULE [ARGS...]`. `known_options` (the
    command's own, where the CLI knows them) tells a labctl option put after `--` from one it lacks."""
    if args and args[0] == "--":
        args = args[1:]
    if not args:
        raise LabError("no training script given", hint=f"{command} -- train.py [ARGS...]  or  {command} -- -m trainer")
    if args[0] in ("-m", "--module"):
        if len(args) < 2 or args[1].startswith("-"):
            raise LabError(f"`{args[0]}` needs a module name, got {args[1:2] or 'nothing'}",
                           hint=f"{command} -- -m trainer --epochs 3")
        return args
    if args[0].startswith("-"):
        option = args[0].split("=", 1)[0]
        if known_options is not None and option in known_options:
            raise LabError(f"{option} is an option of `{command}`, but it came after `--`, where the script and "
                           "its own arguments go", hint=f"put {command}'s options before `--`: "
                                                       f"{command} {option} ... -- SCRIPT [ARGS...]")
        lacks = f", and `{command}` has no option {option}" if known_options is not None else ""
        raise LabError(f"expected the script (a path) or `-m MODULE` first, got option {args[0]!r}{lacks}",
                       hint=f"SCRIPT or -m MODULE comes first, then its own options: {command} -- train.py --lr 0.1"
                            + (f"; `{command} --help` lists labctl's options" if known_options is not None else ""))
    return args


def workspace_script(script_args: list[str], cwd: Path | str, workspace: Path | str) -> list[str]:
    """`script_args` with SCRIPT as the nodes reach it, given as the user means it: relative to `cwd`,
    where they stand. A run's working directory is the workspace (bind-mounted at the same path on
    the lab's nodes, mirrored into each host's workspace folder by `hosts sync`), so SCRIPT becomes
    relative to the workspace. `-m MODULE` is left alone, and so is an absolute path outside the
    workspace (the node's own file, e.g. in its image); a relative one that leads out of the
    workspace is an error: the nodes see only the workspace. The arguments after SCRIPT are the
    script's own and stay as given. Reads nothing but symlinks (a link out of the workspace is out)."""
    if script_args[0] in ("-m", "--module"):
        return script_args
    try:
        os.fsencode(script_args[0])
    except UnicodeEncodeError:  # a lone surrogate no file system can hold
        raise LabError(f"script {script_args[0]!r} cannot be a file name on this system",
                       hint="labctl run -- train.py [ARGS...]  or  labctl run -- -m trainer") from None
    cwd, workspace, script = Path(cwd), Path(workspace), Path(script_args[0])
    located = Path(os.path.realpath(cwd / script))
    if located.is_relative_to(workspace):
        if cwd == workspace and not script.is_absolute():
            return script_args  # as typed: it already means the same on the nodes
        return [located.relative_to(workspace).as_posix(), *script_args[1:]]
    if script.is_absolute():
        return script_args
    raise LabError(f"script {script_args[0]} is {located}, outside the workspace {workspace}: the nodes see only the "
                   "workspace", hint=f"move or copy the script into {workspace}, or run labctl from the workspace "
                                     "that holds it (the nearest folder upwards with a .lab/ folder)")


def job_args(argv: Sequence[str], workspace: Path, cwd: Path | str | None = None) -> list[str]:
    """`SCRIPT [ARGS]` or `-m MODULE [ARGS]`, checked; SCRIPT taken relative to `cwd` when given (as
    the CLI gives it), else to the workspace."""
    script_args = parse_script_args(list(argv))
    return workspace_script(script_args, Path(cwd).resolve(), workspace) if cwd is not None else script_args


def python_argv(script_args: list[str]) -> list[str]:
    return ["python", *script_args]


def torchrun_argv(script_args: list[str], nproc_per_node: int | None) -> list[str]:
    argv = ["torchrun"]
    if nproc_per_node is not None:
        argv += ["--nproc-per-node", str(nproc_per_node)]
    if script_args[0] in ("-m", "--module"):
        return argv + ["-m", *script_args[1:]]
    return argv + script_args


def run_env(run_id: str, run_dir: Path | str) -> dict[str, str]:
    return {RUN_ID_VAR: run_id, RUN_DIR_VAR: str(run_dir)}


def threads_per_process(cpus: int, nodes: int, nproc_per_node: int) -> int:
    """CPU threads each process should use so the lab's processes together fit the machine's CPUs.

    Every node sees all of the host's CPUs, so torch would start one thread per CPU in every
    process; 3 nodes on 2 CPUs then run 6 busy threads on 2 cores and a step takes 20x longer.
    """
    return max(1, cpus // max(1, nodes * nproc_per_node))


# Elastic runs: a lost node's heartbeat goes stale after 10 s, and once the minimum number of nodes
# has joined a new round the others get 3 s more (torch's defaults: 30 s and 30 s).
ELASTIC_RDZV_CONF = "last_call_timeout=3,heartbeat_timeout=10,keep_alive_interval=2"
PG_TIMEOUT_VAR = "DDPLAB_PG_TIMEOUT_S"


@dataclass(frozen=True)
class Elastic:
    """torchrun's fault tolerance: restarts, and a node-count range to continue with fewer."""

    max_restarts: int = 0
    min_nodes: int | None = None
    max_nodes: int | None = None

    @property
    def on(self) -> bool:
        return self.max_restarts > 0 or self.min_nodes is not None


def parse_nnodes(text: str, lab_nodes: int) -> tuple[int, int]:
    """'2:3' -> (2, 3); 'N' -> (N, N). MAX must be the lab's node count: every node starts."""
    lo, sep, hi = str(text).partition(":")
    try:
        low, high = int(lo), int(hi) if sep else int(lo)
    except ValueError:
        raise ConfigError("--nnodes", text, "must be MIN:MAX, e.g. 2:3") from None
    if not 1 <= low <= high:
        raise ConfigError("--nnodes", text, "needs 1 <= MIN <= MAX")
    if high != lab_nodes:
        raise ConfigError("--nnodes", text, f"MAX must be the lab's node count, {lab_nodes}: the run starts on every node",
                          hint=f"--nnodes {min(low, lab_nodes)}:{lab_nodes}")
    return low, high


def with_user_env(own: dict[str, str], added: dict[str, str]) -> dict[str, str]:
    """labctl's values, then the user's (over any of labctl's): --dry-run shows the user's together, last."""
    return {**{key: value for key, value in own.items() if key not in added}, **added}


def build_launches(node_env: dict[str, dict[str, str]], script_args: list[str], *, launcher: str,
                   nproc_per_node: int | None, run_id: str, run_dir: Path | str, cpus: int | None = None,
                   elastic: Elastic = Elastic(), pg_timeout_s: float | None = None,
                   user_env: Mapping[str, str] | None = None) -> list[Launch]:
    """The processes of one run, in node-rank order. `node_env` maps node name -> its env file; a
    subset of the lab's nodes runs a smaller job. Each node runs its env file's NPROC_PER_NODE
    processes (real hosts may differ) unless `nproc_per_node` says otherwise. Given the machine's
    `cpus`, every process gets an OMP_NUM_THREADS that shares them out (see threads_per_process);
    `pg_timeout_s` goes to the trainer's process-group timeout through DDPLAB_PG_TIMEOUT_S. `user_env`
    (-e and --env-file) goes to every process, over labctl's own values (see run.userenv)."""
    added = check_user_env(user_env or {})
    names = list(node_env)
    first = node_env[names[0]]
    nprocs = [nproc_per_node or int(node_env[name].get("NPROC_PER_NODE", "1")) for name in names]
    common = run_env(run_id, run_dir)
    if cpus:
        common["OMP_NUM_THREADS"] = str(threads_per_process(cpus, sum(nprocs), 1))
    if pg_timeout_s:
        common[PG_TIMEOUT_VAR] = f"{pg_timeout_s:g}"
    launches = []
    if launcher == "torchrun":
        for name in names:
            env = {
                **common,
                "PET_NNODES": f"{elastic.min_nodes}:{elastic.max_nodes}" if elastic.min_nodes else str(len(names)),
                # A fresh rendezvous per run, hosted by the run's own store (see STORE_SCRIPT).
                "PET_RDZV_ID": run_id,
                "PET_RDZV_CONF": "is_host=false" + (f",{ELASTIC_RDZV_CONF}" if elastic.on else ""),
            }
            if elastic.on:
                env["PET_MAX_RESTARTS"] = str(elastic.max_restarts)
                # torchrun shares one worker store across restarts by default, so restarted gloo
                # workers read their predecessors' addresses from it and fail to connect
                # ("Gloo connectFullMesh failed ... Connection refused"); without sharing, each
                # attempt's rank 0 hosts a fresh store.
                env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
            launches.append(Launch(name, name, torchrun_argv(script_args, nproc_per_node), with_user_env(env, added)))
        return launches
    if launcher != "static":
        raise LabError(f"unknown launcher {launcher!r}", hint="torchrun or static")
    if elastic.on:
        raise LabError("--max-restarts and --nnodes need torchrun: the static launcher has no agent to restart workers",
                       hint="drop --launcher static")
    world_size = sum(nprocs)
    for node_rank, (name, nproc) in enumerate(zip(names, nprocs)):
        for local_rank in range(nproc):
            rank = sum(nprocs[:node_rank]) + local_rank
            env = {
                **common,
                "RANK": str(rank),
                "LOCAL_RANK": str(local_rank),
                "WORLD_SIZE": str(world_size),
                "LOCAL_WORLD_SIZE": str(nproc),
                "GROUP_RANK": str(node_rank),
                "MASTER_ADDR": first["MASTER_ADDR"],
                "MASTER_PORT": first["MASTER_PORT"],
            }
            label = name if nproc == 1 else f"{name}/r{rank}"
            launches.append(Launch(label, name, python_argv(script_args), with_user_env(env, added)))
    return launches


def store_launch(node: str, master_port: str, run_id: str, run_dir: Path | str) -> Launch:
    return Launch(f"{node}/store", node, ["python", "-c", STORE_SCRIPT, master_port], run_env(run_id, run_dir))
