"""The warm path's servers: one fork server per node (labctl/remote/forkserver.py), started by `up`,
which imports torch once so that a run's workers start in milliseconds (labctl.run.launch.warm_argv).

The server preloads torch, torch.distributed and numpy: what every DDP script imports and what
costs the seconds. Then, once it is idle (LATER), torch._dynamo, which torch.optim imports when a
script makes its first optimizer: about as long again as torch itself, 1.4 to 1.8 s in a node here,
and a no-op or a script without an optimizer never needs it. So the first run after `up` waits only
for torch (and imports torch._dynamo itself if it must), and the runs after it find both imported.
That import waits a second after READY and again after the first run's worker has ended
(forkcommon.LATER_AFTER_S), so that it does not take the cores from the end of that run.
It pays for itself from a lab's third run that makes an optimizer on: a lab that runs one or two
such jobs (a CI job's lab) spends more on it than its runs save, so `up --idle-imports off`
(the lab's `idle_imports` setting, the pytest marker's too) leaves it out, and a run that needs
torch._dynamo then imports it in its workers, as a cold run would.
Nothing of the workspace (the trainer package included) is preloaded: a script and the modules it
imports are read afresh by every run, so a file edited between two runs is never run stale.
The server does not hold up `up`: it binds its socket first and imports while requests wait in its
backlog, so a run right after `up` waits for the import once, as a cold start would.

A node whose server is gone (the container restarted by hand, the server killed) runs its workers
cold, the same way (forkserver.py's request does that itself); `up` starts a missing server again.
The socket's name carries a digest of the server's, worker.py's and forkchild.py's text
(launch.FORK_SOCKET): `up` after an upgrade of labctl ends the servers of the old text and starts one
of the new.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from labctl import remote
from labctl.run.launch import FORK_SOCKET, FORKCHILD_SCRIPT, FORKSERVER_SCRIPT, WORKER_SCRIPT

PRELOAD = ("torch", "torch.distributed", "numpy")
LATER = ("torch._dynamo",)  # imported by the server once idle: see above
IMPORTED_LATER = "imported %s while idle"  # the server's log line for each (forkcommon.IMPORTED_LATER)
# What one idle server holds (its proportional set size after the preload, measured here: 229 MB), and
# how much of the engine's memory `warm=auto` lets the lab's servers take.
SERVER_BYTES = 230 * 1024**2
AUTO_SHARE = 0.4
SERVER_LOG = "/tmp/ddplab/fork.log"  # in each node: the server's own lines (READY, refusals)
START_SCRIPT = remote.load("start-forkserver.sh")  # `sh -c TEXT ...`: see the file


def plan_servers(setting: str, nodes: int, memory_bytes: int) -> tuple[bool, str | None]:
    """(start the fork servers, a note saying why not or what they cost) for the `warm` setting."""
    wanted = nodes * SERVER_BYTES
    if setting == "off":
        return False, "fork servers off (DDPLAB_WARM=off): runs start cold, each worker importing torch"
    if setting == "on" or not memory_bytes or wanted <= AUTO_SHARE * memory_bytes:
        return True, None
    return False, (f"no fork servers: {nodes} of them would hold {gib(wanted)} of the engine's {gib(memory_bytes)} "
                   f"(warm=auto keeps them to {AUTO_SHARE:.0%}); runs start cold, each worker importing torch. "
                   "--warm on starts them anyway")


def gib(size: int) -> str:
    return f"{size / 1024**3:.1f} GiB"


def server_argv(preload: tuple[str, ...] = (), idle_imports: bool = True) -> list[str]:
    """The command that starts a node's fork server in the background, importing PRELOAD and `preload`
    (the user's modules, `up --preload`) at once and LATER when idle (unless `idle_imports` is off): a
    no-op where one of the same command line runs."""
    modules = [*PRELOAD, *(m for m in preload if m not in PRELOAD)]
    return ["sh", "-c", START_SCRIPT, FORKSERVER_SCRIPT, FORK_SOCKET, WORKER_SCRIPT, FORKCHILD_SCRIPT, *modules,
            "--", *later_modules(preload, idle_imports)]


def later_modules(preload: tuple[str, ...] = (), idle_imports: bool = True) -> list[str]:
    """What a server started with `preload` (`up --preload`) imports once idle: LATER, less those;
    nothing where the lab's idle imports are off."""
    return [m for m in LATER if m not in preload] if idle_imports else []


STOP = "pkill -f 'serve /tmp/ddplab/fork-[0-9a-f]+[.]sock' || true"


def stop_servers(nodes, names: list[str]) -> None:
    """End every fork server on the nodes of `names` (`warm off` on a running lab)."""
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(lambda node: nodes.run(node, ["sh", "-c", STOP]), names))


def start_servers(nodes, names: list[str], preload: tuple[str, ...] = (), idle_imports: bool = True) -> dict[str, str]:
    """Start the fork server on every node of `names` (a run.executor.Nodes), importing `preload` too
    (and LATER once idle, unless `idle_imports` is off); what failed, by node."""
    def start(node: str) -> tuple[str, str]:
        try:
            code, output = nodes.run(node, server_argv(preload, idle_imports))
        except Exception as exc:  # noqa: BLE001 - a node that cannot start one runs its workers cold
            return node, str(exc)
        return node, "" if code == 0 else output.strip() or f"exit status {code}"

    with ThreadPoolExecutor(max_workers=16) as pool:
        return {node: why for node, why in pool.map(start, names) if why}
