"""The classic traps, reproduced on purpose on a throwaway lab, diagnosed, fixed.

Each scenario: bring up a fresh 2-node lab, break it the way people break real clusters, run
the trainer the way they would (bare torchrun or a static launch, with short timeouts instead of
torch's minutes), show the symptom exactly as torch prints it and how long it took to show, show
what `labctl doctor` says about the same configuration, apply the fix, run again to success, and
remove the lab. A "break" is an environment (what the user exported or wrote in an env file) plus,
for some traps, a change to the machine (a firewall rule, a second network, a CPU limit).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Callable

from labctl.errors import LabError
from labctl.run.launch import Launch, run_env
from labctl.run.plan import RunPlan, new_run

TRAINER = ["-m", "trainer", "--epochs", "1", "--samples", "1024"]
PG_TIMEOUT_S = 12  # the trainer's process-group timeout in the broken runs (torch's default: 30 min)
RDZV_READ_TIMEOUT_S = 10  # torchrun's store read timeout in the broken runs (default: 60 s)

Env = dict[str, dict[str, str]]  # node -> environment overrides


@dataclass
class Context:
    client: object
    lab: str
    nodes: list  # NodeState
    iface: str
    run_id: str = ""
    notes: dict = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]

    def ip(self, node: str) -> str:
        return next(n.ip for n in self.nodes if n.name == node)


@dataclass
class Scenario:
    name: str
    title: str
    lesson: str
    bound_s: int  # the whole scenario, bring-up to tear-down
    symptom: str  # regex for the line torch prints
    launcher: str  # "torchrun" or "static"
    broken: Callable[[Context], Env]
    fixed: Callable[[Context], Env]
    fix: str  # what the user changes, in words
    prepare: Callable[[Context], None] | None = None  # a change to the machine, before the broken run
    repair: Callable[[Context], None] | None = None  # undoing it, before the fixed run
    trainer: list[str] = field(default_factory=lambda: list(TRAINER))
    other_torch_on_last_node: bool = False  # version-mismatch: the last node runs another torch release
    symptom_required: bool = True  # False where the honest symptom may be "nothing at all"


# ------------------------------------------------------------------------------ environments


def torchrun_env(ctx: Context, **extra: str) -> Env:
    """What bare `torchrun` on each node reads: the node's env file, with a fresh rendezvous id."""
    return {node: {"PET_RDZV_ID": ctx.run_id, "DDPLAB_PG_TIMEOUT_S": str(PG_TIMEOUT_S), **extra} for node in ctx.names}


def static_env(ctx: Context, ranks: list[int]) -> Env:
    """A by-hand static launch: RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT exported per node."""
    return {node: {"RANK": str(rank), "NODE_RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": str(len(ctx.names)),
                   "DDPLAB_PG_TIMEOUT_S": str(PG_TIMEOUT_S)} for node, rank in zip(ctx.names, ranks)}


def with_conf(ctx: Context, conf_for: Callable[[str], str], **extra: str) -> Env:
    env = torchrun_env(ctx, **extra)
    for node in ctx.names:
        env[node]["PET_RDZV_CONF"] = conf_for(node)
    return env


# ------------------------------------------------------------------------------ machine changes

MESH_PREFIX = "100.101.0."  # Tailscale's CGNAT range, 100.64.0.0/10


def add_mesh(ctx: Context) -> None:
    """A second address on every node, as a Tailscale mesh gives each machine: node0's mesh
    address is on its interface but is not what its hostname resolves to, which is exactly what
    torchrun's is-this-me guess misses."""
    from labctl.net.apply import _node_image, run_helper
    from labctl.net.tc import Command

    image = _node_image(ctx.client, ctx.lab, ctx.names[0])
    for i, node in enumerate(ctx.names):
        address = f"{MESH_PREFIX}{10 + i}"
        code, output = run_helper(ctx.client, ctx.lab, node, image,
                                  [Command(("ip", "addr", "add", f"{address}/24", "dev", ctx.iface))])
        if code != 0:
            raise LabError(f"could not add the mesh address on {node}: {output.strip()}")
        ctx.notes[f"mesh-ip:{node}"] = address


def mesh_endpoint(ctx: Context) -> str:
    return f"{ctx.notes[f'mesh-ip:{ctx.names[0]}']}:29500"


def firewall_commands(iface: str, allowed_port: int) -> list:
    """New TCP connections to any port but `allowed_port` are dropped: rendezvous works, every
    back-connect times out. This kernel has neither tc's action modules (`action drop`) nor the prio
    qdisc, so it is built from htb classification alone, on each node's egress: a TCP SYN (SYN set,
    ACK clear: byte 33 of an option-less IPv4 packet) goes to a class whose queue holds nothing
    (pfifo limit 0), unless it is for the allowed port."""
    from labctl.net.tc import Command

    u32 = ("protocol", "ip", "u32", "match", "ip", "protocol", "6", "0xff")
    return [
        Command(("tc", "qdisc", "add", "dev", iface, "root", "handle", "1:", "htb", "default", "10")),
        Command(("tc", "class", "add", "dev", iface, "parent", "1:", "classid", "1:10", "htb", "rate", "10gbit")),
        Command(("tc", "class", "add", "dev", iface, "parent", "1:", "classid", "1:30", "htb", "rate", "1mbit")),
        Command(("tc", "qdisc", "add", "dev", iface, "parent", "1:30", "handle", "30:", "pfifo", "limit", "0")),
        Command(("tc", "filter", "add", "dev", iface, "parent", "1:", "prio", "1", *u32,
                 "match", "ip", "dport", str(allowed_port), "0xffff", "flowid", "1:10")),
        Command(("tc", "filter", "add", "dev", iface, "parent", "1:", "prio", "2", *u32,
                 "match", "u8", "0x02", "0x12", "at", "33", "flowid", "1:30")),
    ]


def firewall_on(ctx: Context) -> None:
    from labctl.net.apply import _node_image, run_helper

    image = _node_image(ctx.client, ctx.lab, ctx.names[0])
    for node in ctx.names:
        code, output = run_helper(ctx.client, ctx.lab, node, image, firewall_commands(ctx.iface, 29500))
        if code != 0:
            raise LabError(f"could not set up the firewall on {node}: {output.strip()}")


def firewall_off(ctx: Context) -> None:
    from labctl.net.apply import _node_image, run_helper
    from labctl.net.tc import Command

    image = _node_image(ctx.client, ctx.lab, ctx.names[0])
    for node in ctx.names:
        run_helper(ctx.client, ctx.lab, node, image, [Command(("tc", "qdisc", "del", "dev", ctx.iface, "root"), True)])


def slow_last(ctx: Context) -> None:
    from labctl.lab.docker import apply_node_cpus

    apply_node_cpus(ctx.client, ctx.lab, ctx.names[-1], 0.3)


def unslow_last(ctx: Context) -> None:
    from labctl.lab.docker import apply_node_cpus

    apply_node_cpus(ctx.client, ctx.lab, ctx.names[-1], None)


# ------------------------------------------------------------------------------ the traps

SCENARIOS = {s.name: s for s in [
    Scenario(
        name="hostname-trap",
        title="Nobody hosts the rendezvous store",
        lesson="torchrun guesses whether it hosts the c10d store by matching the endpoint against the machine's "
               "hostname and addresses. Over a VPN (here each node gets a second, Tailscale-style 100.101.0.x "
               "address) node0 does not recognise its own mesh address, every node becomes a client, and all of "
               "them time out dialing a store nobody started.",
        bound_s=120,
        symptom=r"client socket has timed out.*|RendezvousConnectionError.*|DistNetworkError.*",
        launcher="torchrun",
        prepare=add_mesh,
        broken=lambda ctx: with_conf(ctx, lambda node: f"read_timeout={RDZV_READ_TIMEOUT_S}",
                                     PET_RDZV_ENDPOINT=mesh_endpoint(ctx)),
        fixed=lambda ctx: with_conf(ctx, lambda node: f"is_host={'true' if node == ctx.names[0] else 'false'},"
                                                      f"read_timeout={RDZV_READ_TIMEOUT_S}",
                                    PET_RDZV_ENDPOINT=mesh_endpoint(ctx)),
        fix="--rdzv-conf is_host=true on the store's node and is_host=false on the others "
            "(PET_RDZV_CONF; labctl's env files set it)",
    ),
    Scenario(
        name="duplicate-rank",
        title="Two nodes both export RANK=0",
        lesson="With a static launch each process is told its rank by hand. Two rank-0 processes each host a "
               "store of their own and wait for a peer that never arrives: a hang at 0% CPU with no error until "
               "the process-group timeout, which is 30 minutes by default.",
        bound_s=90,
        symptom=r"DistStoreError.*|could not form a gloo process group.*|Timed out.*",
        launcher="static",
        broken=lambda ctx: static_env(ctx, [0] * len(ctx.names)),
        fixed=lambda ctx: static_env(ctx, list(range(len(ctx.names)))),
        fix="give every node its own RANK, 0..N-1 (NODE_RANK in labctl's env files)",
    ),
    Scenario(
        name="wrong-nic",
        title="gloo on the wrong network interface",
        lesson="gloo binds the interface named by GLOO_SOCKET_IFNAME and tells its peers that address. Pointed at "
               "loopback, every rank advertises 127.0.0.1: rendezvous succeeds (it uses MASTER_ADDR), then the "
               "full-mesh connect dials each peer's loopback and fails or hangs.",
        bound_s=90,
        symptom=r".*(connectFullMesh|Connection refused|timed out|Timeout|could not form).*",
        launcher="torchrun",
        broken=lambda ctx: torchrun_env(ctx, GLOO_SOCKET_IFNAME="lo"),
        fixed=lambda ctx: torchrun_env(ctx, GLOO_SOCKET_IFNAME=ctx.iface),
        fix="GLOO_SOCKET_IFNAME (and NCCL_SOCKET_IFNAME) = the interface on the cluster network; "
            "find it with `ip route get MASTER_ADDR`",
    ),
    Scenario(
        name="firewall",
        title="The firewall opens 29500 and nothing else",
        lesson="Rendezvous goes through one port, so opening 29500 makes it pass; then gloo and NCCL connect "
               "back between every pair of nodes on ephemeral ports, and a firewall that drops those makes the job "
               "hang right after rendezvous.",
        bound_s=120,
        symptom=r".*(connectFullMesh|timed out|Timeout|could not form|Connection).*",
        launcher="torchrun",
        prepare=firewall_on,
        repair=firewall_off,
        broken=lambda ctx: torchrun_env(ctx),
        fixed=lambda ctx: torchrun_env(ctx),
        fix="allow TCP between the nodes on the ephemeral range (32768-60999), not only the rendezvous port",
    ),
    Scenario(
        name="version-mismatch",
        title="Two torch releases in one job",
        lesson="torch never compares versions between nodes. With one node on another release the job may "
               "fail in an unrelated-looking way, or run and give subtly different numbers; nothing says why. "
               "Here node1 runs torch 2.14.1 (a CUDA build, on CPU) against 2.13.0 on node0.",
        bound_s=150,
        symptom=r".*(Error|error:|failed|Traceback).*",
        launcher="torchrun",
        broken=lambda ctx: torchrun_env(ctx),
        fixed=lambda ctx: torchrun_env(ctx),
        fix="one torch release on every node: one image for all (`labctl up` does), or pin the release on "
            "every real machine",
        other_torch_on_last_node=True,
        symptom_required=False,
    ),
    Scenario(
        name="straggler",
        title="One slow node drags everyone",
        lesson="DDP is bulk-synchronous: every step waits for the slowest rank's gradients. A node with a "
               "fraction of a CPU (thermal throttling, a weaker laptop) sets everyone's pace; the trainer names it "
               "and says how long the others waited.",
        bound_s=120,
        symptom=r"straggler: .*",
        launcher="torchrun",
        prepare=slow_last,
        repair=unslow_last,
        broken=lambda ctx: torchrun_env(ctx),
        fixed=lambda ctx: torchrun_env(ctx),
        fix="find out why the node is slow (here: `labctl slow NODE --clear`), or give it less work with "
            "--rank-micro-batch (see `labctl bench straggler`)",
        trainer=["-m", "trainer", "--workload", "gpt", "--steps", "12", "--threads", "1"],
    ),
]}


# ------------------------------------------------------------------------------ running one


@dataclass
class Outcome:
    name: str
    symptom: str
    seconds_to_show: float
    broken_exit: int | None
    doctor: list[str]
    doctor_seconds: float
    fix: str
    fixed_ok: bool
    fixed_seconds: float
    total_seconds: float
    bound_s: int

    symptom_required: bool = True

    @property
    def ok(self) -> bool:
        shown = bool(self.symptom) or not self.symptom_required
        return self.fixed_ok and shown and bool(self.doctor) and self.total_seconds <= self.bound_s


def scenario_plan(ctx: Context, scenario: Scenario, env: Env, run_dir, node_env: dict) -> RunPlan:
    """One run of the scenario as a plan: every node's own launch environment (`env`, the trap or its
    fix) over the run's, and no rendezvous store of labctl's: the scenario sets the rendezvous itself."""
    argv = (["torchrun"] if scenario.launcher == "torchrun" else ["python"]) + scenario.trainer
    common = run_env(ctx.run_id, run_dir)
    launches = [Launch(node, node, argv, {**common, "OMP_NUM_THREADS": "1", **env[node]}) for node in ctx.names]
    return RunPlan(ctx.run_id, run_dir, node_env, launches, torchrun=False)


def group_findings(findings) -> list[str]:
    """One line per distinct problem, naming every node it was found on."""
    by_message: dict[str, list[str]] = {}
    for f in findings:
        by_message.setdefault(f.message, []).append(f.node)
    return [msg if nodes == ["all"] else f"{', '.join(n for n in nodes if n != 'all')}: {msg}"
            for msg, nodes in by_message.items()]


def first_symptom(pattern: str, outcomes) -> str:
    regex = re.compile(pattern)
    for outcome in outcomes:
        for line in outcome.lines:
            match = regex.search(line)
            if match:
                return match.group(0).strip()[:300]
    return ""


def run_scenario(client, config, workspace, scenario: Scenario, report) -> Outcome:
    """The whole story on a throwaway lab (config.lab), which is removed whatever happens."""
    import shutil

    from labctl.diagnose import doctor
    from labctl.lab import lifecycle as lab_mod
    from labctl.lab.session import LabSession

    other_image = None
    if scenario.other_torch_on_last_node:  # built once and cached, before the clock starts
        from labctl.lab.image import ensure_mismatch_image

        other_image = ensure_mismatch_image(client, config, report)
    started = time.monotonic()
    lab_mod.apply_down(client, config.lab, volumes=True)
    try:
        report(f"{scenario.name}: bringing up {config.nodes} nodes ({config.lab})")
        document, env_files, subnet = lab_mod.plan_up(client, config, workspace)
        if other_image:
            last = config.node_names[-1]
            document["services"][last]["image"] = other_image
            report(f"{scenario.name}: {last} runs {other_image}")
        nodes = lab_mod.apply_up(client, config, workspace, document, env_files, lambda _m: None)
        ctx = Context(client, config.lab, nodes, config.iface)
        session = LabSession(config, workspace, client)
        if scenario.prepare:
            scenario.prepare(ctx)

        ctx.run_id, run_dir = new_run(session.directory)
        broken_env = scenario.broken(ctx)
        report(f"{scenario.name}: the broken run ({scenario.launcher})")
        t0 = time.monotonic()
        limit = max(10.0, scenario.bound_s - (t0 - started) - 40)
        broken = session.execute(scenario_plan(ctx, scenario, broken_env, run_dir, session.node_env(ctx.names)),
                                 timeout_s=limit, echo=False, check=False)
        failed = [o for o in broken.outcomes if o.exit_code not in (0, None)]
        shown_at = min((o.ended for o in failed if o.ended), default=None) or max(o.ended or t0 for o in broken.outcomes)
        symptom = first_symptom(scenario.symptom, broken.outcomes)
        broken_exit = max((o.exit_code or 0 for o in broken.outcomes), default=0)

        report(f"{scenario.name}: labctl doctor on the same configuration")
        found = doctor.diagnose(client, config.lab, nodes, subnet, env_overrides=broken_env)
        doctor_s, diagnosis = found.seconds, group_findings(found.problems)

        if scenario.repair:
            scenario.repair(ctx)
        if other_image:  # the fix: the same image on every node (Compose recreates the odd one)
            document["services"][config.node_names[-1]]["image"] = config.image_tag
            nodes = lab_mod.apply_up(client, config, workspace, document, env_files, lambda _m: None)
            ctx.nodes = nodes
        ctx.run_id, run_dir = new_run(session.directory)
        report(f"{scenario.name}: the fixed run")
        t1 = time.monotonic()
        fixed = session.execute(scenario_plan(ctx, scenario, scenario.fixed(ctx), run_dir, session.node_env(ctx.names)),
                                timeout_s=max(10.0, scenario.bound_s - (t1 - started)), echo=False, check=False)
        fixed_s = time.monotonic() - t1
        if scenario.name == "straggler":  # fixed means: no straggler named any more
            fixed_ok = fixed.ok and not first_symptom(scenario.symptom, fixed.outcomes)
        else:
            fixed_ok = fixed.ok
    finally:
        lab_mod.apply_down(client, config.lab, volumes=True)
        shutil.rmtree(lab_mod.lab_dir(workspace, config.lab), ignore_errors=True)
    return Outcome(scenario.name, symptom, shown_at - t0, broken_exit, diagnosis, doctor_s, scenario.fix, fixed_ok,
                   fixed_s, time.monotonic() - started, scenario.bound_s, scenario.symptom_required)


def select_scenarios(names) -> list[str]:
    """The scenarios asked for (`all` for every one), each once, in the order given."""
    wanted = list(SCENARIOS) if list(names) == ["all"] else list(dict.fromkeys(names))
    unknown = [n for n in wanted if n not in SCENARIOS]
    if unknown:
        raise LabError(f"no scenario {', '.join(map(repr, unknown))}", hint=f"one of: {', '.join(SCENARIOS)}, or all")
    return wanted


def run_scenarios(client, make_config, workspace, names: list[str], report, show=None) -> list[Outcome]:
    """Each scenario on a 2-node lab of its own, scn-NAME (`make_config(lab=...)` resolves its
    configuration); `show` gets each outcome as soon as it is known."""
    from dataclasses import replace

    outcomes = []
    for name in names:
        config = replace(make_config(lab=f"scn-{name}"), nodes=2)
        outcomes.append(run_scenario(client, config, workspace, SCENARIOS[name], report))
        if show:
            show(outcomes[-1])
    return outcomes
