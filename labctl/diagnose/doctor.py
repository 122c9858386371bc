"""`labctl doctor`: find what would make a run hang, in seconds, before anything can hang.

Each check names the node, what is wrong and the fix. The checks, cheapest first:

  engine     which engine the lab runs on: Docker Engine (rootful or rootless), Docker Desktop or
             Podman, its version and endpoint (DOCKER_HOST or the docker context)
  env        every node's launch environment (what torchrun and the trainer will read): node ranks
             unique and complete, the same world size, master address and port everywhere,
             is_host=true on exactly one node (the hostname-matching trap), a socket interface set
  versions   torch (its release: 2.13.0+cpu and 2.13.0 agree) and Python identical on every node, CUDA and
             NCCL on every node that has them (torch itself never checks)
  packages   every other distribution the nodes' Python sees, the same on every node and as the lab's
             lock says where it has one (labctl/diagnose/packages.py)
  gpus       one backend for every rank ($DDPLAB_BACKEND, else nccl where CUDA is), and on nccl a GPU
             of its own for every rank: no node with more ranks than visible GPUs, no GPU on two
             nodes (NCCL: "Duplicate GPU detected"), no CPU node (labctl/diagnose/gpus.py)
  compiler   a C++ compiler and the Python headers on every node, which torch.compile's CPU backend
             builds its kernels with (a warning: a run that does not compile works without them)
  iface      the configured socket interface exists on every node and carries an address on the
             lab's subnet (gloo otherwise picks another NIC, or fails to find one)
  cpus       no node has a smaller CPU allowance than the others (a straggler by configuration: a
             warning, since a run works anyway and the lab makes stragglers on purpose)
  rendezvous every node reaches node0's master port
  ports      every node reaches every other node on a port in the ephemeral range, where gloo and
             NCCL connect back after rendezvous (a firewall that only opens 29500 breaks here)
  mtu        on a lab with a mesh VPN (`up --overlay`): packets of the tunnel's full MTU pass between
             every pair of nodes, sent with don't-fragment (labctl/diagnose/tunnel.py: a path that
             carries less and drops the ICMP that would say so stalls large collectives)

All but the last three are "cheap" (one short exec per node) and run before every `labctl run`; the
probes listen and connect for about two seconds, side by side.
"""

from __future__ import annotations

import ipaddress
import json
import random
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from labctl import remote
from labctl.core.proc import last_json_line
from labctl.diagnose import slurm as slurm_checks
from labctl.diagnose.compiler import check_compiler
from labctl.diagnose.findings import Diagnosis, Finding
from labctl.diagnose.gpus import check_gpus
from labctl.diagnose.packages import check_packages
from labctl.diagnose.tunnel import check_mtu, probe_mtu, tunnel_address
from labctl.engine.detect import inspect_engine, refusal
from labctl.engine.docker import DockerNodes, node_cpus_limit
from labctl.engine.labels import container_name
from labctl.image.lockfile import Lock, release
from labctl.net.overlay_apply import running_overlay
from labctl.slurm.cluster import is_slurm_lab

CONNECT_S = 1.5  # how long a probe keeps trying one target (peers may still be starting to listen)
PROBE_PORTS = (40000, 59999)  # inside Linux's default ephemeral range, 32768-60999
PROBE_DRAWS = 3  # probe ports drawn before a bind error on one is reported (probe_reach)


# ------------------------------------------------------------------------------ pure checks


def check_engine(engine) -> list[Finding]:
    """Which engine the lab runs on (its kind, version, endpoint), and whether a lab can run there."""
    problem = refusal(engine)
    message = f"{engine.kind}: {engine.describe()}"
    return [Finding("engine", "all", problem is None, message if problem is None else f"{message}; {problem.message}",
                    problem.hint if problem else "")]


def check_env(envs: dict[str, dict[str, str]], tunnel: str | None = None) -> list[Finding]:
    """The launch environment of every node, as torchrun and the trainer will read it; `tunnel`: the
    interface of the lab's mesh VPN, where it has one."""
    names = list(envs)
    out = agreement(envs, "WORLD_SIZE", "every node must agree on the world size: regenerate the env files with "
                                        "`labctl up`")
    out += agreement(envs, "MASTER_ADDR", "every node must dial the same rendezvous host: regenerate the env files")
    out += agreement(envs, "MASTER_PORT", "every node must dial the same rendezvous port: regenerate the env files")
    out += rank_findings(envs) + world_findings(envs)
    hosts = [node for node, env in envs.items() if "is_host=true" in env.get("PET_RDZV_CONF", "")]
    if len(hosts) != 1:
        which = ", ".join(hosts) if hosts else "no node"
        out.append(Finding("env", "all", False,
                           f"is_host=true on {which}: exactly one node must host the rendezvous store. torchrun "
                           "otherwise guesses from hostnames and addresses, which fails on bridges and VPNs: every "
                           "node waits for a store nobody hosts, until 'The client socket has timed out'",
                           "PET_RDZV_CONF=is_host=true on node0 only, is_host=false elsewhere (labctl's env files do this)"))
    for node, env in envs.items():
        if not env.get("GLOO_SOCKET_IFNAME"):
            mesh = f" (this lab's mesh VPN: GLOO_SOCKET_IFNAME={tunnel})" if tunnel else ""
            out.append(Finding("env", node, False, "GLOO_SOCKET_IFNAME is not set: gloo takes the address the node's "
                               "hostname resolves to (a lab's eth0, a laptop's 127.0.1.1), which may not be on the "
                               f"network the others reach{mesh}", "set GLOO_SOCKET_IFNAME (and NCCL_SOCKET_IFNAME) to "
                               f"the interface that reaches the others{mesh}"))
    if not out:
        world = next(iter(envs.values())).get("WORLD_SIZE")
        out.append(Finding("env", "all", True, f"{len(names)} nodes, ranks 0..{len(names) - 1}, world size {world}, "
                           f"store on {hosts[0]}"))
    return out


def agreement(envs: dict[str, dict[str, str]], key: str, fix: str) -> list[Finding]:
    """A finding for every node whose `key` is missing or differs from what most nodes have."""
    values = {node: env.get(key) for node, env in envs.items()}
    counts = Counter(values.values())
    if len(counts) == 1 and None not in counts:
        return []
    common = counts.most_common(1)[0][0]
    return [Finding("env", node, False, f"{key}={value!r}, but {common!r} on the other nodes", fix)
            for node, value in values.items() if value != common or value is None]


def rank_findings(envs: dict[str, dict[str, str]]) -> list[Finding]:
    """Node ranks unique, and none of 0..N-1 missing."""
    out, count = [], len(envs)
    ranks: dict[str, list[str]] = {}
    for node, env in envs.items():
        ranks.setdefault(env.get("NODE_RANK", "?"), []).append(node)
    for rank, nodes in ranks.items():
        if len(nodes) > 1:
            out += [Finding("env", node, False, f"NODE_RANK={rank} on {' and '.join(nodes)}: ranks must be unique "
                            "(with a static launch, two RANK=0 processes deadlock in init_process_group at 0% CPU)",
                            f"give each node its own rank 0..{count - 1}") for node in nodes]
    missing = sorted({str(i) for i in range(count)} - set(ranks), key=int)
    if missing:
        out.append(Finding("env", "all", False, f"no node has NODE_RANK {', '.join(missing)}; "
                           f"ranks must be 0..{count - 1}", "regenerate the env files with `labctl up`"))
    return out


def world_findings(envs: dict[str, dict[str, str]]) -> list[Finding]:
    """Each node runs its own NPROC_PER_NODE processes (real hosts may differ): they add up to WORLD_SIZE."""
    world = next(iter(envs.values())).get("WORLD_SIZE")
    nprocs = [env.get("NPROC_PER_NODE") or "" for env in envs.values()]
    if world and world.isdigit() and all(p.isdigit() for p in nprocs) and int(world) != sum(map(int, nprocs)):
        return [Finding("env", "all", False, f"WORLD_SIZE={world} but the nodes' NPROC_PER_NODE add up to "
                        f"{' + '.join(nprocs)} = {sum(map(int, nprocs))}", "regenerate the env files with `labctl up`")]
    return []


VERSION_KEYS = ("torch", "python", "cuda", "nccl")
CUDA_KEYS = ("cuda", "nccl")  # compared among the nodes that have them: a CPU node has none, and that is no mismatch


def check_versions(info: dict[str, dict]) -> list[Finding]:
    out = []
    for key in VERSION_KEYS:
        raw = {node: i.get(key) for node, i in info.items() if key not in CUDA_KEYS or i.get(key)}
        values = {node: release(v) if key == "torch" else v for node, v in raw.items()}
        counts = Counter(values.values())
        if len(counts) <= 1:
            continue
        common = counts.most_common(1)[0][0]
        shown = next(raw[node] for node, v in values.items() if v == common)  # as a node reports it
        for node, value in values.items():
            if value != common:
                others = "the other GPU nodes" if key in CUDA_KEYS else "the other nodes"
                out.append(Finding("versions", node, False,
                                   f"{key} {raw[node]} here, {shown} on {others}: torch never checks this, and "
                                   "mixed releases hang or fail in unrelated-looking ways",
                                   "run every node on one image (`labctl up` does); on real machines pin one release"))
    if not out:
        first = next(iter(info.values()))
        text = f"torch {release(first.get('torch'))}, Python {first.get('python')} on every node"
        gpu = [i for i in info.values() if i.get("cuda")]
        if gpu:
            text += f"; CUDA {gpu[0]['cuda']}, NCCL {gpu[0].get('nccl') or '?'} on the {len(gpu)} with CUDA"
        out.append(Finding("versions", "all", True, text))
    return out


def check_iface(info: dict[str, dict], envs: dict[str, dict[str, str]], subnet: str | None,
                how_to_set: Callable[[str], str] = lambda node: "set GLOO_SOCKET_IFNAME to",
                overlay: str | None = None) -> list[Finding]:
    """The socket interface of each node exists and carries an address (on the lab's subnet, or its
    `overlay`'s network, if given). `how_to_set(node)` starts the fix: in the lab an env var, on real
    hosts the inventory."""
    out = []
    net = ipaddress.ip_network(subnet) if subnet else None
    nets = [n for n in (net, ipaddress.ip_network(overlay) if overlay else None) if n is not None]
    if overlay and net:
        subnet = f"{subnet} or the overlay's {overlay}"
    for node, i in info.items():
        iface = envs.get(node, {}).get("GLOO_SOCKET_IFNAME")
        if not iface:
            continue
        addrs = i.get("ifaces", {}).get(iface)
        have = ", ".join(f"{name} ({', '.join(a) or 'no address'})" for name, a in i.get("ifaces", {}).items())
        master = envs[node].get("MASTER_ADDR", "MASTER_ADDR")
        if addrs is None:
            out.append(Finding("iface", node, False, f"GLOO_SOCKET_IFNAME={iface}, but {node} has no such interface "
                               f"(gloo fails with 'Unable to find address for: {iface}'); it has: {have}",
                               f"{how_to_set(node)} the interface that reaches the others (on {node}, "
                               f"`ip route get {master}` names it)"))
            continue
        on_subnet = [a for a in addrs if not nets or any(ipaddress.ip_interface(a).ip in n for n in nets)]
        if not on_subnet:
            where = f"none on the lab subnet {subnet}" if nets else "no IPv4 address"
            out.append(Finding("iface", node, False, f"{iface} carries {', '.join(addrs) or 'no address'}, {where}: "
                               "gloo would advertise an address the peers cannot reach",
                               f"{how_to_set(node)} the interface with an address{f' in {subnet}' if nets else ''}; "
                               f"it has: {have}"))
    if not out:
        ifaces = sorted({envs[n].get("GLOO_SOCKET_IFNAME", "?") for n in info})
        where = f" on {subnet}" if subnet else ""
        out.append(Finding("iface", "all", True, f"{', '.join(ifaces)} up with an address{where} on every node"))
    return out


def check_reach(results: dict[str, dict], master: tuple[str, str, int], probe_port: int,
                connect_s: float = CONNECT_S, tunnel: str | None = None) -> list[Finding]:
    """Findings from every node's probe: {node: {"bind_errors": {port: error}, "results": [[target, ip, port, status, ms]]}}.
    `tunnel`: the interface of the lab's mesh VPN, where it has one and gloo is not on it yet."""
    out = []
    master_node, master_ip, master_port = master
    for node, r in results.items():
        for port, error in (r.get("bind_errors") or {}).items():
            if int(port) == master_port:
                out.append(Finding("rendezvous", node, False, f"cannot listen on MASTER_PORT {port}: {error}",
                                   "a run may still hold it: wait for it, or move the lab with `labctl up --master-port`"))
            else:
                out.append(Finding("ports", node, False, f"cannot listen on probe port {port}: {error}", "run doctor again"))
    rdzv_bad, ports_bad = [], []
    for node, r in results.items():
        for target, ip, port, status, ms in r.get("results", []):
            if status == "ok":
                continue
            why = {"timeout": f"no answer in {connect_s:g} s: packets are dropped (a firewall)",
                   "refused": "connection refused: nothing listens, or a firewall rejects it"}.get(status, status)
            if port == master_port and target == master_node:
                rdzv_bad.append(Finding("rendezvous", node, False, f"{node} cannot reach the rendezvous {master_ip}:{port} "
                                        f"on {target}: {why}", f"open TCP {port} on {target} to the other nodes"))
            else:
                ports_bad.append(Finding("ports", node, False, f"{node} cannot reach {target} ({ip}) on port {port}: {why}. "
                                         "Rendezvous may pass and the job still hang: gloo and NCCL connect back on "
                                         "ephemeral ports", f"allow TCP between the nodes on the ephemeral range "
                                         f"(32768-60999), not only {master_port}, on {target}"
                                         + (f"; or gloo on the mesh VPN: GLOO_SOCKET_IFNAME={tunnel}" if tunnel else "")))
    n = len(results)
    out += rdzv_bad or [Finding("rendezvous", "all", True, f"every node reaches {master_ip}:{master_port} on {master_node}")]
    out += ports_bad or [Finding("ports", "all", True, f"all {n * (n - 1)} node pairs connect on port {probe_port}")]
    return out


# ------------------------------------------------------------------------------ gathering

INFO_SCRIPT = remote.load("node_info.py")  # `python -c TEXT`: one line of JSON, hostname, versions, ifaces
PROBE_SCRIPT = remote.load("probe.py")  # `python -c TEXT CONFIG_JSON`: listens, connects, one line of JSON


def container_env(client, lab: str, node: str) -> dict[str, str]:
    """The environment a `docker exec` on the node starts with: what torchrun will read."""
    env = client.api.inspect_container(container_name(lab, node))["Config"].get("Env") or []
    return dict(item.split("=", 1) for item in env if "=" in item)


def _parse_json(node: str, output: str) -> dict:
    report = last_json_line(output)
    if report is None:
        raise ValueError(f"{node}: no report ({output.strip()[-200:]})")
    return report


def node_info(nodes, node: str, path: tuple[str, ...] = ()) -> dict:
    """What INFO_SCRIPT reports of one node: hostname, versions, packages, interfaces and their
    addresses; `path`: folders the job will have first on sys.path (a host's packages folder)."""
    code, output = nodes.run(node, ["python", "-c", INFO_SCRIPT, *path])
    return _parse_json(node, output)


def gather_info(nodes, names: list[str]) -> dict[str, dict]:
    """node_info of every node at once. `nodes` is a run.executor.Nodes (lab containers or SSH hosts)."""
    with ThreadPoolExecutor(max_workers=16) as pool:
        return dict(zip(names, pool.map(lambda node: node_info(nodes, node), names)))


def probe_reach(nodes, ips: dict[str, str], master: tuple[str, str, int], probe_port: int | None = None,
                connect_s: float = CONNECT_S) -> tuple[int, dict[str, dict]]:
    """Every node listens (node0 also on the master port) and connects to every other node: (the
    probe port, each node's report). A port drawn at random that some node's own process holds
    (slurmd's just after it restarted, a run's) is doctor's collision, not the user's: the others'
    connections to it are refused too, which would read as a firewall. So another port is drawn,
    up to PROBE_DRAWS times; a port given is probed once."""
    for _ in range(1 if probe_port else PROBE_DRAWS):
        port = probe_port or random.randint(*PROBE_PORTS)
        results = probe_once(nodes, ips, master, port, connect_s)
        if not any(int(p) == port for r in results.values() for p in (r.get("bind_errors") or {})):
            break
    return port, results


def probe_once(nodes, ips: dict[str, str], master: tuple[str, str, int], probe_port: int,
               connect_s: float) -> dict[str, dict]:
    """One probe_reach on `probe_port`: each node's report."""
    master_node, master_ip, master_port = master

    def one(node: str) -> dict:
        targets = [[other, ip, probe_port] for other, ip in ips.items() if other != node]
        if node != master_node:
            targets.append([master_node, master_ip, master_port])
        peers = len(ips) - 1  # each dials this node's probe port, and the master port on the master
        cfg = {"listen": [probe_port] + ([master_port] if node == master_node else []), "targets": targets,
               "connect_s": connect_s, "window_s": connect_s + 0.8,
               "expect": peers * (2 if node == master_node else 1)}
        _, output = nodes.run(node, ["python", "-c", PROBE_SCRIPT, json.dumps(cfg)])
        return _parse_json(node, output)

    with ThreadPoolExecutor(max_workers=16) as pool:
        return dict(zip(ips, pool.map(one, list(ips))))


def gloo_address(node_info: dict, env: dict[str, str], mesh, bridge_ip: str) -> str:
    """The address the node's gloo advertises, which its peers connect back to: its tunnel's where
    GLOO_SOCKET_IFNAME names the lab's mesh VPN, else its bridge address (the hostname's)."""
    on_tunnel = mesh is not None and env.get("GLOO_SOCKET_IFNAME") == mesh.iface
    return (tunnel_address(node_info, mesh.iface) if on_tunnel else None) or bridge_ip


def check_cpus(limits: dict[str, float | None]) -> list[Finding]:
    """Nodes with less CPU than the others: a straggler by configuration."""
    values = {node: limit for node, limit in limits.items()}
    most = [v for v in values.values() if v is not None]
    out = []
    if len(set(values.values())) > 1:
        best = None if None in values.values() else max(most)
        for node, limit in values.items():
            if limit is not None and (best is None or limit < best):
                out.append(Finding("cpus", node, False, f"{node} is limited to {limit:g} CPUs, the others to "
                                   f"{'none' if best is None else f'{best:g}'}: every step will wait for it",
                                   f"`labctl slow {node} --clear`, or balance with --rank-micro-batch", warn=True))
    return out or [Finding("cpus", "all", True, "every node has the same CPU allowance")]


def diagnose(client, lab: str, nodes: list, subnet: str | None, cheap: bool = False,
             env_overrides: dict[str, dict[str, str]] | None = None, nproc_per_node: int | None = None,
             lock: tuple[str, Lock] | None = None) -> Diagnosis:
    """doctor on the lab's running `nodes`. `cheap` skips the reachability probes;
    `env_overrides` checks an environment a launch would add on top of each node's own,
    `nproc_per_node` a launch's processes per node (for the GPU checks), and `lock` (its path, the
    Lock) the packages every node should have."""
    t0 = time.monotonic()
    names = [n.name for n in nodes]
    engine = inspect_engine(client)
    cpus = engine.cpus
    with ThreadPoolExecutor(max_workers=16) as pool:
        envs = dict(zip(names, pool.map(lambda n: container_env(client, lab, n), names)))
    for node, extra in (env_overrides or {}).items():
        envs[node] = {**envs.get(node, {}), **extra}
    docker_nodes = DockerNodes(client, lab)
    info = gather_info(docker_nodes, names)
    mesh = running_overlay(client, lab, subnet)  # `up --overlay`: gloo may use its tunnel as well
    findings = (check_engine(engine) + check_env(envs, mesh.iface if mesh else None) + check_versions(info)
                + check_packages(info, lock[1] if lock else None, *(lock[:1] if lock else ()))
                + check_gpus(info, envs, nproc_per_node) + check_compiler(info)
                + check_iface(info, envs, subnet, overlay=mesh.network if mesh else None)
                + check_cpus({n: node_cpus_limit(client, lab, n, cpus) for n in names}))
    if not cheap:
        first = envs[names[0]]
        master_node = next((n for n in names if envs[n].get("NODE_RANK") == "0"), names[0])
        try:
            master_port = int(first.get("MASTER_PORT", "29500"))
        except ValueError:
            master_port = 29500
        master = (master_node, first.get("MASTER_ADDR", ""), master_port)
        gloo = {n.name: gloo_address(info[n.name], envs[n.name], mesh, n.ip) for n in nodes}
        off_tunnel = mesh.iface if mesh and any(ip == n.ip for n, ip in zip(nodes, gloo.values())) else None
        with ThreadPoolExecutor(max_workers=2) as pool:
            mtu = pool.submit(probe_mtu, docker_nodes, info, mesh.iface) if mesh else None
            port, results = probe_reach(docker_nodes, gloo, master)
            findings += (check_reach(results, master, port, tunnel=off_tunnel)
                         + (check_mtu(mtu.result(), mesh.iface) if mtu else []))
    if is_slurm_lab(client, lab):
        findings += slurm_checks.check(lab, *slurm_checks.gather(client, lab, names), names)
    for node in names:
        info[node].pop("packages", None)  # compared above; the report keeps what it shows per node
        info[node]["ip"] = next(n.ip for n in nodes if n.name == node)
        info[node]["iface"] = envs[node].get("GLOO_SOCKET_IFNAME")
    return Diagnosis(f"lab {lab}: nodes", findings, info, time.monotonic() - t0)
