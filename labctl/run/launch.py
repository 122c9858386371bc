"""What each node runs for `labctl run`: launcher argv and environment. Pure: returns data.

torchrun: the node's env file already carries PET_* defaults, so the command is the bare
`torchrun SCRIPT ARGS`. Per run we only override the rendezvous id (a fresh one each run) and the
store host (see `store_launch` and labctl/remote/store.py).

static: the manual style people use on VMs: RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT exported by hand and plain `python SCRIPT ARGS`, one process per rank.

warm (the default, where it gives torchrun's semantics): one process per rank, each forked by the
node's fork server (labctl/remote/forkserver.py), which imported torch once at `up`, with exactly
the environment torchrun's agent gives a worker, joining the run's own store as torchrun's workers
do. A node without a server starts the worker cold, the same way.

Every worker runs through labctl/remote/worker.py (under torchrun: `--no-python python -c TEXT`), so a
script's sys.exit(N) is the process's status N every time: gloo's threads cannot abort the
interpreter's teardown, because there is none.
"""

from __future__ import annotations

import hashlib
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Collection, Literal, Mapping, Sequence

from labctl import remote
from labctl.errors import ConfigError, LabError
from labctl.run.userenv import check_user_env

# Written out again in labctl/remote's scripts, which tests/unit/test_remote.py holds to these.
RUN_ID_VAR = "DDPLAB_RUN_ID"  # every process of a run inherits it; `stop` finds them by it
RUN_DIR_VAR = "DDPLAB_RUN_DIR"  # where the trainer writes its per-rank metrics
# where the trainer keeps the link's probes, one file a state of the links: <runs' parent>/links
# (trainer/linkstate.py), beside runs/ in the lab's folder (or a host's copy of it)
LINKS_DIR_VAR = "DDPLAB_LINKS_DIR"
LINKS_FOLDER = "links"
STORE_READY = "DDPLAB_STORE_READY"
STORE_FAILED = "DDPLAB_STORE_FAILED"

# The programs a run ships to its nodes as `python -c TEXT ...`, from labctl/remote/:
STORE_SCRIPT = remote.load("store.py")  # the run's rendezvous store on node0: TEXT PORT; see store_launch
PORT_CHECK_SCRIPT = remote.load("port_check.py")  # is the rendezvous port free? TEXT PORT: exit 0, or 3 and why
# TEXT stop RUN_ID GRACE_S stops a run's processes on a node (by DDPLAB_RUN_ID, SIGTERM then SIGKILL);
# TEXT watch GRACE_S ARGV... runs a launch on a real host and stops its run when the SSH session closes.
STOP_SCRIPT = remote.load("stop.py")
WORKER_SCRIPT = remote.load("worker.py")  # TEXT SCRIPT ARGS: every worker, run as python runs it (see worker_argv)
# TEXT serve ... / TEXT request ...: the warm path (forkserver.py, forkrequest.py and forkcommon.py: remote.PARTS)
FORKSERVER_SCRIPT = remote.load("forkserver.py")
FORKCHILD_SCRIPT = remote.load("forkchild.py")  # the server's: a forked worker given the request's world
# In each node, beside the registry of forked workers (forkcommon.REGISTRY), named by the programs'
# text: a labctl whose fork server, worker.py or forkchild.py differ never asks a server running the old ones.
FORK_SOCKET = "/tmp/ddplab/fork-%s.sock" % hashlib.sha256(
    (FORKSERVER_SCRIPT + WORKER_SCRIPT + FORKCHILD_SCRIPT).encode()).hexdigest()[:12]
LAUNCHERS = ("auto", "warm", "torchrun", "static")
Launcher = Literal["auto", "warm", "torchrun", "static"]
TORCHRUN_MODULE = "torch.distributed.run"  # what the `torchrun` console script runs


@dataclass(frozen=True)
class Launch:
    """One process tree to start on one node (which `executor.Nodes` reaches, by the node's name)."""

    label: str  # the output prefix, e.g. node1 or node1/r3
    node: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    hold_stdin: bool = False  # labctl keeps its stdin open, and closes it to end it (Nodes.release)

    @property
    def torchrun(self) -> bool:
        """An agent of torchrun's (the `torchrun` command, or its module), whose workers it starts."""
        return bool(self.argv) and (self.argv[0] == "torchrun" or TORCHRUN_MODULE in self.argv)

    def display(self) -> str:
        """`ENV=... argv` as a person reads it: a program labctl ships as text shown by its name."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        argv = " ".join(f"<labctl/remote/{remote.name_of(a)}>" if remote.name_of(a) else shlex.quote(a) for a in self.argv)
        return f"{env} {argv}".strip()


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


def worker_argv(script_args: list[str]) -> list[str]:
    """`python SCRIPT ARGS` through worker.py: the script as Python runs it, its exit status every time."""
    return ["python", "-c", WORKER_SCRIPT, *script_args]


def warm_argv(script_args: list[str]) -> list[str]:
    """A worker forked by the node's fork server; where none answers, started cold (worker_argv)."""
    return ["python", "-c", FORKSERVER_SCRIPT, "request", FORK_SOCKET, WORKER_SCRIPT, "--", *script_args]


def torchrun_argv(script_args: list[str], nproc_per_node: int | None) -> list[str]:
    """torchrun (`python -m torch.distributed.run`, what the `torchrun` command runs) on the node,
    it and its workers forked by the node's fork server (warm_argv; cold where it has none): its
    workers are `--no-python python -c FORKSERVER request SOCKET WORKER -- SCRIPT ARGS`. The agent is
    torchrun's own code doing what it always does (rendezvous, start, watch and restart its workers);
    neither it nor its workers import torch again."""
    agent = ["-m", TORCHRUN_MODULE]
    if nproc_per_node is not None:
        agent += ["--nproc-per-node", str(nproc_per_node)]
    return warm_argv([*agent, "--no-python", *warm_argv(script_args)])


def choose_launcher(asked: str, elastic: Elastic) -> tuple[str, str]:
    """(the launcher a run takes, why), from --launcher (auto by default)."""
    if asked not in LAUNCHERS:
        raise ConfigError("--launcher", asked, f"must be one of {', '.join(LAUNCHERS)}")
    if asked != "auto":
        return asked, f"--launcher {asked}"
    if elastic.on:
        return "torchrun", ("--max-restarts and --nnodes need torchrun's agents, which restart the workers and "
                            "rendezvous again")
    return "warm", "each node's fork server forks the workers from a process that has torch imported already"


def run_env(run_id: str, run_dir: Path | str) -> dict[str, str]:
    """What every process of a run is told by labctl: its run id, its folder (<parent>/runs/<id>) and
    where the lab's link calibrations are kept (<parent>/links)."""
    return {RUN_ID_VAR: run_id, RUN_DIR_VAR: str(run_dir), LINKS_DIR_VAR: str(Path(run_dir).parent.parent / LINKS_FOLDER)}


def threads_per_process(cpus: int, nodes: int, nproc_per_node: int) -> int:
    """CPU threads each process should use so the lab's processes together fit the machine's CPUs.

    Every node sees all of the host's CPUs, so torch would start one thread per CPU in every
    process; 3 nodes on 2 CPUs then run 6 busy threads on 2 cores and a step takes 20x longer.
    """
    return max(1, cpus // max(1, nodes * nproc_per_node))


# Elastic runs: a node whose keep-alive (every 2 s) is three intervals old is dropped from the
# rendezvous, 6 s (torch: 5 s, 15 s), and once the minimum number of nodes has joined a round the
# others get 10 s more (torch: 30 s), which the survivors of a lost node wait too. heartbeat_timeout
# bounds one keep-alive write. The join itself is quick only with worker.py's quicken_rendezvous.
ELASTIC_RDZV_CONF = "last_call_timeout=10,heartbeat_timeout=10,keep_alive_interval=2"
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


@dataclass(frozen=True)
class LaunchOptions:
    """How a run's processes start and how long it may take, checked: what build_launches reads, made
    from a run's RunOptions (labctl.run.plan) for its nodes. Nothing here names the nodes."""

    launcher: Launcher = "auto"  # --launcher; build_launches takes the one choose_launcher settled on
    nproc_per_node: int | None = None  # processes per node; None: each node's env file's NPROC_PER_NODE
    elastic: Elastic = Elastic()  # --max-restarts and --nnodes (torchrun's fault tolerance)
    pg_timeout_s: float | None = None  # the trainer's process-group timeout (DDPLAB_PG_TIMEOUT_S); None: torch's
    env: Mapping[str, str] | None = None  # -e and --env-file: added to every process's environment
    timeout_s: float | None = None  # --timeout-s: the whole run is stopped after this long; None: no limit


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


def build_launches(node_env: dict[str, dict[str, str]], script_args: list[str], options: LaunchOptions, *,
                   run_id: str, run_dir: Path | str, cpus: int | None = None) -> list[Launch]:
    """The processes of one run, in node-rank order. `node_env` maps node name -> its env file; a
    subset of the lab's nodes runs a smaller job. Each node runs its env file's NPROC_PER_NODE
    processes (real hosts may differ) unless `options.nproc_per_node` says otherwise. Given the machine's
    `cpus`, every process gets an OMP_NUM_THREADS that shares them out (see threads_per_process);
    `options.pg_timeout_s` goes to the trainer's process-group timeout through DDPLAB_PG_TIMEOUT_S.
    `options.env` (-e and --env-file) goes to every process, over labctl's own values (see run.userenv).

    `options.launcher` is one `choose_launcher` settled on: torchrun (an agent per node), warm (one process
    per rank, forked by the node's fork server, with the environment torchrun gives a worker) or
    static (one `python` per rank, the manual style)."""
    launcher, nproc_per_node, elastic, pg_timeout_s = (options.launcher, options.nproc_per_node, options.elastic,
                                                       options.pg_timeout_s)
    added = check_user_env(options.env or {})
    names = list(node_env)
    nprocs = [nproc_per_node or int(node_env[name].get("NPROC_PER_NODE", "1")) for name in names]
    common = run_env(run_id, run_dir)
    if cpus:
        common["OMP_NUM_THREADS"] = str(threads_per_process(cpus, sum(nprocs), 1))
    if pg_timeout_s:
        common[PG_TIMEOUT_VAR] = f"{pg_timeout_s:g}"
    if launcher == "torchrun":
        return [Launch(name, name, torchrun_argv(script_args, nproc_per_node),
                       with_user_env({**common, **network_env(node_env[name]),
                                      **rendezvous_env(run_id, len(names), elastic)}, added))
                for name in names]
    if launcher not in ("warm", "static"):
        raise LabError(f"unknown launcher {launcher!r}", hint=f"one of {', '.join(LAUNCHERS)}")
    if elastic.on:
        raise LabError(f"--max-restarts and --nnodes need torchrun: the {launcher} launcher has no agent to restart "
                       "workers", hint="leave --launcher out (auto picks torchrun for them) or say --launcher torchrun")
    launches = []
    for rank, node_rank, local_rank in ranks(nprocs):
        name, first = names[node_rank], node_env[names[0]]
        if launcher == "warm":
            env = {**common, **network_env(node_env[name]), **rendezvous_env(run_id, len(names), elastic),
                   **worker_env(rank, node_rank, local_rank, nprocs, first, run_id, run_dir)}
            argv = warm_argv(script_args)
        else:
            env = {**common, **network_env(node_env[name]), "RANK": str(rank), "LOCAL_RANK": str(local_rank),
                   "WORLD_SIZE": str(sum(nprocs)),
                   "LOCAL_WORLD_SIZE": str(nprocs[node_rank]), "GROUP_RANK": str(node_rank),
                   "MASTER_ADDR": first["MASTER_ADDR"], "MASTER_PORT": first["MASTER_PORT"]}
            argv = worker_argv(script_args)
        label = name if nprocs[node_rank] == 1 else f"{name}/r{rank}"
        launches.append(Launch(label, name, argv, with_user_env(env, added)))
    return launches


# What of a node's env file a launch carries itself rather than leave to the container's copy: the network
# the job uses, which a lab with an overlay moves onto its tunnel for a run (labctl.net.overlay.envs_on).
NETWORK_KEYS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "PET_RDZV_ENDPOINT", "PET_LOCAL_ADDR")


def network_env(env: Mapping[str, str]) -> dict[str, str]:
    return {key: env[key] for key in NETWORK_KEYS if key in env}


def ranks(nprocs: list[int]) -> list[tuple[int, int, int]]:
    """(global rank, node rank, local rank) of every process, nodes in order, as torchrun numbers them."""
    return [(sum(nprocs[:node]) + local, node, local) for node, nproc in enumerate(nprocs) for local in range(nproc)]


def rendezvous_env(run_id: str, nnodes: int, elastic: Elastic) -> dict[str, str]:
    """torchrun's per-run overrides of the env file's PET_* defaults."""
    env = {
        "PET_NNODES": f"{elastic.min_nodes}:{elastic.max_nodes}" if elastic.min_nodes else str(nnodes),
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
    return env


def worker_env(rank: int, node_rank: int, local_rank: int, nprocs: list[int], first: Mapping[str, str], run_id: str,
               run_dir: Path | str) -> dict[str, str]:
    """What torchrun's agent gives each worker (torch/distributed/elastic/agent/server/
    local_elastic_agent.py, _start_workers), for the warm path: the same keys, the same values
    where they mean the same. The store the workers share is the run's own (STORE_SCRIPT on the
    first node), and TORCHELASTIC_USE_AGENT_STORE says to join it rather than host one, as torchrun's
    workers join their rank-0 agent's: MASTER_ADDR and MASTER_PORT name that store (under torchrun,
    the rank-0 agent's hostname and a port it picked). tests/integration/test_warm.py compares the
    two environments key by key."""
    world = sum(nprocs)
    return {
        "RANK": str(rank), "GROUP_RANK": str(node_rank), "ROLE_RANK": str(rank), "ROLE_NAME": "default",
        "LOCAL_WORLD_SIZE": str(nprocs[node_rank]), "WORLD_SIZE": str(world), "GROUP_WORLD_SIZE": str(len(nprocs)),
        "ROLE_WORLD_SIZE": str(world), "MASTER_ADDR": first["MASTER_ADDR"], "MASTER_PORT": first["MASTER_PORT"],
        "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": run_id,
        "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",  # torchrun's own, in its workers too
        "LOCAL_RANK": str(local_rank),
        # where torch.distributed.elastic's @record writes a worker's uncaught error (torchrun: a temp dir)
        "TORCHELASTIC_ERROR_FILE": f"{run_dir}/error-rank{rank}.json",
    }


def store_launch(node: str, master_port: str, run_id: str, run_dir: Path | str, warm: bool = False,
                 until_eof: bool = False) -> Launch:
    """The run's rendezvous store on `node`; `warm`: forked by the node's fork server, as the run's
    workers are, instead of importing torch anew; `until_eof`: it also ends when labctl closes its
    stdin (where the nodes let labctl hold it: Nodes.holds_stdin)."""
    store = ["-c", STORE_SCRIPT, master_port, *(["--until-eof"] if until_eof else [])]
    argv = warm_argv(store) if warm else ["python", *store]
    return Launch(f"{node}/store", node, argv, run_env(run_id, run_dir), hold_stdin=until_eof)
