"""doctor on GPU and mixed labs, from synthetic node_info dicts: the torch release across CPU and CUDA
builds, CUDA and NCCL among the GPU nodes only, and every rank's GPU its own (NCCL's "Duplicate GPU")."""

import pytest

from labctl.diagnose.doctor import check_versions
from labctl.diagnose.gpus import check_gpus, gpu_text


def gpu(index, uuid, name="NVIDIA H100 80GB HBM3"):
    return {"index": str(index), "name": name, "uuid": uuid, "driver_version": "550.54.15"}


def cuda_node(*gpus, torch="2.13.0", cuda="12.8", nccl="2.27.3"):
    return {"torch": torch, "python": "3.11.2", "cuda": cuda, "nccl": nccl, "gpus": list(gpus),
            "gpu_source": "nvidia-smi", "driver": "550.54.15"}


def cpu_node(torch="2.13.0+cpu"):
    return {"torch": torch, "python": "3.11.2", "cuda": None, "nccl": None, "gpus": [], "gpu_source": None, "driver": None}


def envs(n, nproc=1, **extra):
    return {f"node{i}": {"NPROC_PER_NODE": str(nproc), **extra} for i in range(n)}


def failures(findings):
    return [(f.check, f.node) for f in findings if not f.ok]


# ---------------------------------------------------------------------------------------------- versions


def test_the_cpu_and_the_cuda_build_of_one_release_agree():
    info = {"node0": cuda_node(gpu(0, "GPU-a")), "node1": cpu_node()}
    [ok] = check_versions(info)
    assert ok.ok and ok.message.startswith("torch 2.13.0, Python 3.11.2 on every node; CUDA 12.8, NCCL 2.27.3")


@pytest.mark.parametrize("other", ["2.14.1", "2.14.1+cpu", "2.14.1+cu128"])
def test_two_releases_still_disagree_whatever_their_builds(other):
    info = {"node0": cpu_node(), "node1": cpu_node(), "node2": cuda_node(gpu(0, "GPU-a"), torch=other)}
    [bad] = [f for f in check_versions(info) if not f.ok]
    assert bad.node == "node2" and f"torch {other} here, 2.13.0+cpu on the other nodes" in bad.message


def test_cuda_and_nccl_compare_among_the_gpu_nodes_only():
    info = {"node0": cuda_node(gpu(0, "GPU-a")), "node1": cuda_node(gpu(0, "GPU-b")), "node2": cpu_node(),
            "node3": cuda_node(gpu(0, "GPU-c"), cuda="12.6", nccl="2.21.5")}
    bad = [f for f in check_versions(info) if not f.ok]
    assert failures(bad) == [("versions", "node3"), ("versions", "node3")]
    assert "cuda 12.6 here, 12.8 on the other GPU nodes" in bad[0].message
    assert "nccl 2.21.5 here, 2.27.3 on the other GPU nodes" in bad[1].message


# ------------------------------------------------------------------------------------------------- gpus


def test_a_cpu_lab_has_nothing_to_say_about_gpus():
    assert check_gpus({"node0": cpu_node(), "node1": cpu_node()}, envs(2)) == []


def test_one_gpu_per_rank_passes():
    info = {"node0": cuda_node(gpu(0, "GPU-a"), gpu(1, "GPU-b")), "node1": cuda_node(gpu(0, "GPU-c"), gpu(1, "GPU-d"))}
    [ok] = check_gpus(info, envs(2, nproc=2, DDPLAB_BACKEND="nccl"))
    assert ok.ok and "nccl on 2 GPU nodes" in ok.message


def test_more_ranks_than_visible_gpus_is_two_ranks_on_one_gpu():
    info = {"node0": cuda_node(gpu(0, "GPU-a")), "node1": cuda_node(gpu(0, "GPU-b"))}
    found = check_gpus(info, envs(2, nproc=2))
    assert failures(found) == [("gpus", "node0"), ("gpus", "node1")]
    assert "2 ranks on node0, which has 1 visible GPU (1: NVIDIA H100 80GB HBM3)" in found[0].message
    assert "Duplicate GPU detected" in found[0].message and found[0].fix.startswith("--nproc-per-node 1 at most")
    # a run's --nproc-per-node is what counts, over the env files'
    assert failures(check_gpus(info, envs(2, nproc=1), nproc_per_node=2)) == [("gpus", "node0"), ("gpus", "node1")]
    assert failures(check_gpus(info, envs(2, nproc=2), nproc_per_node=1)) == []


def test_two_nodes_handed_the_same_gpu_are_both_named():
    info = {"node0": cuda_node(gpu(0, "GPU-same")), "node1": cuda_node(gpu(0, "GPU-same")),
            "node2": cuda_node(gpu(0, "GPU-own"))}
    found = check_gpus(info, envs(3))
    assert failures(found) == [("gpus", "node0"), ("gpus", "node1")]
    assert "node0 and node1 were handed the same GPU GPU-same" in found[0].message


def test_on_gloo_gpus_are_not_used_so_not_judged():
    info = {"node0": cuda_node(gpu(0, "GPU-same")), "node1": cuda_node(gpu(0, "GPU-same"))}
    [ok] = check_gpus(info, envs(2, nproc=4, DDPLAB_BACKEND="gloo"))
    assert ok.ok and "gloo on every node" in ok.message


def test_nccl_asked_of_a_lab_with_a_cpu_node_names_it():
    info = {"node0": cuda_node(gpu(0, "GPU-a")), "node1": cpu_node()}
    [bad] = [f for f in check_gpus(info, envs(2, DDPLAB_BACKEND="nccl")) if not f.ok]
    assert bad.node == "node1" and "DDPLAB_BACKEND=nccl) but has no CUDA build of torch" in bad.message
    assert "DDPLAB_BACKEND=gloo" in bad.fix


def test_auto_on_a_mixed_lab_splits_the_backends():
    info = {"node0": cuda_node(gpu(0, "GPU-a")), "node1": cpu_node()}
    [bad] = check_gpus(info, envs(2))
    assert (bad.ok, bad.node) == (False, "all")
    assert "gloo on node1; nccl on node0" in bad.message and "hang at the first collective" in bad.message


def test_a_cuda_node_with_no_gpu_visible_picks_gloo_on_auto():
    info = {"node0": cuda_node(), "node1": cuda_node()}  # the CUDA image on nodes given no GPU
    assert check_gpus(info, envs(2)) == []


def test_the_gpus_column():
    assert gpu_text([]) == "-"
    assert gpu_text([gpu(0, "a"), gpu(1, "b")]) == "2: NVIDIA H100 80GB HBM3 x2"
    assert gpu_text([{"index": "0"}, {"uuid": "GPU-9"}]) == "0,GPU-9"


# ------------------------------------------------------------------------------ node_info.py, in a node


def test_node_info_lists_nvidia_smis_gpus_as_cuda_visible_devices_narrows_them(tmp_path):
    import json
    import os
    import subprocess
    import sys

    from labctl import remote

    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, NVIDIA H100 80GB HBM3, GPU-aaa, 550.54.15'\n"
                   "echo '1, NVIDIA H100 80GB HBM3, GPU-bbb, 550.54.15'\n")
    smi.chmod(0o755)

    def info(**env):
        full = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
        full.update(PATH=f"{tmp_path}{os.pathsep}{os.environ['PATH']}", **env)
        out = subprocess.run([sys.executable, "-c", remote.load("node_info.py")], capture_output=True, text=True,
                             env=full, check=True).stdout
        return json.loads(out)

    everything = info()
    assert [g["uuid"] for g in everything["gpus"]] == ["GPU-aaa", "GPU-bbb"]
    assert (everything["gpu_source"], everything["driver"]) == ("nvidia-smi", "550.54.15")
    assert [g["uuid"] for g in info(CUDA_VISIBLE_DEVICES="GPU-bbb")["gpus"]] == ["GPU-bbb"]
    assert [g["index"] for g in info(CUDA_VISIBLE_DEVICES="1,0")["gpus"]] == ["1", "0"]
    assert info(CUDA_VISIBLE_DEVICES="")["gpus"] == []
