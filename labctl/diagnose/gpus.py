"""doctor's GPU checks, on the facts node_info.py gathers (labctl/remote/node_info.py): which backend
each node's ranks will use, and whether every nccl rank gets a GPU of its own.

NCCL refuses two ranks on one GPU at its first collective, "Duplicate GPU detected : rank 1 and
rank 0 both on CUDA device 1000" (ncclInvalidUsage), and it does so whether the two ranks share a
node (nproc_per_node above the node's visible GPUs) or sit in two containers handed the same GPU
(the same UUID on two nodes). Ranks that disagree on the backend (auto on a lab of GPU and CPU
nodes: nccl on one, gloo on the other) pass rendezvous and hang at the first collective. Each is
named here before a run, with the node and the fix.
"""

from __future__ import annotations

from collections import Counter

from labctl.diagnose.findings import Finding

BACKEND_VAR = "DDPLAB_BACKEND"  # trainer/backend.py reads it; `labctl up` writes it for labs with GPU nodes
DUPLICATE = "NCCL refuses it at the first collective: 'Duplicate GPU detected : rank 1 and rank 0 both on CUDA device ...'"


def has_gpu(info: dict) -> bool:
    """Whether torch on this node would see CUDA: a CUDA build, and a GPU visible to it."""
    return bool(info.get("cuda")) and bool(info.get("gpus"))


def node_backend(info: dict, env: dict[str, str]) -> str:
    """The backend the trainer picks on this node: $DDPLAB_BACKEND, else auto (nccl where CUDA is)."""
    requested = (env.get(BACKEND_VAR) or "auto").strip().lower()
    if requested in ("nccl", "gloo"):
        return requested
    return "nccl" if has_gpu(info) else "gloo"


def gpu_text(gpus: list[dict]) -> str:
    """'2: NVIDIA H100 80GB HBM3 x2' (nvidia-smi's names), '1: GPU-8f1c...' or '0,1' (the ids), '-' for none."""
    if not gpus:
        return "-"
    names = Counter(g.get("name") for g in gpus if g.get("name"))
    if names:
        return f"{len(gpus)}: " + ", ".join(f"{name} x{n}" if n > 1 else name for name, n in names.items())
    return ",".join(str(g.get("index") or g.get("uuid")) for g in gpus)


def check_gpus(info: dict[str, dict], envs: dict[str, dict[str, str]], nproc_per_node: int | None = None) -> list[Finding]:
    """The GPU findings: backend agreement, a GPU per nccl rank, no GPU shared by two nodes.
    `nproc_per_node` is a run's override of each node's NPROC_PER_NODE. Nothing for a lab with
    no GPU anywhere and no backend asked for (a CPU lab on gloo, as ever)."""
    known = {node: i for node, i in info.items() if "gpus" in i}  # hosts whose node_info predates GPUs: not judged
    backends = {node: node_backend(i, envs.get(node, {})) for node, i in known.items()}
    asked = {envs.get(node, {}).get(BACKEND_VAR) for node in known} - {None, ""}
    if not any(has_gpu(i) for i in known.values()) and not asked:
        return []
    out = []
    if len(set(backends.values())) > 1:
        split = "; ".join(f"{b} on {', '.join(n for n in backends if backends[n] == b)}" for b in sorted(set(backends.values())))
        out.append(Finding("gpus", "all", False, f"the nodes would not agree on a backend ({split}): ranks on nccl and "
                           "ranks on gloo pass rendezvous and hang at the first collective",
                           f"one backend for every rank: `labctl run -e {BACKEND_VAR}=gloo` (or the trainer's "
                           "--backend gloo), or nccl with a GPU on every node"))
    for node, i in known.items():
        if backends[node] != "nccl":
            continue
        if not has_gpu(i):
            what = "no CUDA build of torch" if not i.get("cuda") else "no GPU visible"
            out.append(Finding("gpus", node, False, f"{node} is to run nccl ({BACKEND_VAR}="
                               f"{envs.get(node, {}).get(BACKEND_VAR)}) but has {what}: NCCL needs a GPU per rank",
                               f"give {node} a GPU and the CUDA image, or run the lab on gloo "
                               f"(`labctl run -e {BACKEND_VAR}=gloo`)"))
            continue
        nproc_text = str(nproc_per_node or envs.get(node, {}).get("NPROC_PER_NODE") or "1")
        if nproc_text.isdigit() and int(nproc_text) > len(i["gpus"]):
            out.append(Finding("gpus", node, False, f"{nproc_text} ranks on {node}, which has {len(i['gpus'])} visible "
                               f"GPU{'s' * (len(i['gpus']) != 1)} ({gpu_text(i['gpus'])}): two ranks on one GPU. "
                               + DUPLICATE, f"--nproc-per-node {len(i['gpus'])} at most on {node}, or give it more GPUs"))
    holders: dict[str, list[str]] = {}
    for node, i in known.items():
        if backends[node] == "nccl":
            for uuid in {g.get("uuid") for g in i.get("gpus") or []} - {None}:
                holders.setdefault(uuid, []).append(node)
    for uuid, nodes in holders.items():
        if len(nodes) > 1:
            out += [Finding("gpus", node, False, f"{' and '.join(nodes)} were handed the same GPU {uuid}: two ranks "
                            "on one GPU. " + DUPLICATE, "give each node GPUs of its own (`labctl up --gpus`), "
                            "or run the lab on gloo") for node in nodes]
    if not out:
        gpu_nodes = [n for n in known if backends[n] == "nccl"]
        if gpu_nodes:
            out.append(Finding("gpus", "all", True, f"nccl on {len(gpu_nodes)} GPU node{'s' * (len(gpu_nodes) != 1)}, "
                               "a GPU of its own for every rank"))
        else:
            out.append(Finding("gpus", "all", True, "gloo on every node (GPU nodes, if any, compute on the CPU)"))
    return out
