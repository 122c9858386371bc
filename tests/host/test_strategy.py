"""The trainer's --strategy flag (trainer/strategy.py) under torchrun on this machine: zero's and fsdp's
checkpoints resume, fsdp's resharded for another world size; hsdp on two torchrun agents of two
processes each, as two nodes. What does not go with a strategy is refused in tests/unit/test_strategy.py."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hostrun import REPO, host_env, torchrun


def train(tmp_path, ranks, *flags):
    """`-m trainer --workload gpt` under torchrun on this machine: its SUMMARY and its output."""
    out = torchrun(tmp_path / "torchrun", "-m", "trainer", "--workload", "gpt", "--global-batch", "24", "--micro-batch",
                   "4", "--run-dir", tmp_path / "run", "--data-dir", tmp_path / "data", "--no-metrics", *flags, nproc=ranks)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    line = next(line for line in out.stdout.splitlines() if "SUMMARY " in line)
    return json.loads(line.split("SUMMARY ", 1)[1]), out.stdout


@pytest.mark.parametrize("strategy, first, then", [("fsdp", 3, 2), ("zero", 2, 2)])
def test_a_sharded_run_checkpoints_and_resumes_to_the_loss_of_one_that_never_stopped(tmp_path, strategy, first, then):
    whole, _ = train(tmp_path / "whole", then, "--steps", "6", "--strategy", strategy)
    ckpt = str(tmp_path / "ckpt")
    # The first run checkpoints step 3 (not its last, step 4); another, on `then` ranks, goes on from there.
    train(tmp_path / "first", first, "--steps", "4", "--ckpt-every", "3", "--ckpt-dir", ckpt, "--strategy", strategy)
    assert sorted(p.name for p in Path(ckpt).iterdir()) == ["step-3" if strategy == "fsdp" else "step-3.pt"]
    resumed, out = train(tmp_path / "then", then, "--steps", "6", "--ckpt-every", "10", "--ckpt-dir", ckpt,
                         "--strategy", strategy)
    assert "resuming from step 3" in out and resumed["resumed_from_step"] == 3
    assert abs(resumed["final_loss"] - whole["final_loss"]) <= 1e-5 * abs(whole["final_loss"]), (resumed, whole)


def test_hsdp_and_tensor_parallelism_on_two_nodes_of_two_processes_end_at_ddps_loss(tmp_path):
    """Two torchrun agents on this machine stand for two nodes of two processes each. hsdp shards within
    a node; tp splits each block over a node's two processes (and replicates across nodes), fsdp+tp
    shards those halves across nodes too: each ends at DDP's loss for the same global batches, two
    micro-batches a step under tp (a node's processes share one share of the data)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = host_env()
    runs = {}
    for strategy in ("ddp", "hsdp", "tp", "fsdp+tp"):
        agents = [subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=2", f"--node_rank={node}",
             "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}", f"--rdzv_id={strategy}", "--log-dir",
             str(tmp_path / f"torchrun-{strategy}-{node}"), "-m", "trainer", "--workload", "gpt", "--steps", "4",
             "--global-batch", "32", "--strategy", strategy, "--run-dir", str(tmp_path / strategy), "--data-dir", str(tmp_path / "data"),
             "--no-metrics"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for node in (0, 1)]
        outs = [agent.communicate(timeout=300) for agent in agents]
        assert all(a.returncode == 0 for a in agents), [o[1][-2000:] for o in outs]
        line = next(line for out, _ in outs for line in out.splitlines() if "SUMMARY " in line)
        runs[strategy] = json.loads(line.split("SUMMARY ", 1)[1])
        runs[strategy]["printed"] = outs[0][0]
    ddp, hsdp = runs["ddp"], runs["hsdp"]
    assert hsdp["world_size"] == 4 and hsdp["replicas_consistent"]
    assert abs(hsdp["final_loss"] - ddp["final_loss"]) <= 1e-5 * abs(ddp["final_loss"])
    # sharded over a node's 2 processes: about half of DDP's state; the gradient shards all-reduced across nodes
    assert hsdp["state_bytes_per_rank"] <= ddp["state_bytes_per_rank"] / 2 + 8192
    assert set(hsdp["collectives_per_step"]) == {"all_gather", "reduce_scatter", "all_reduce"}
    blocks = 2 * 64 * (3 * 64 + 64 + 4 * 64 + 4 * 64) * 4  # gpt's two blocks' weights, fp32: what tp halves
    for name, across in (("tp", {"all_reduce"}), ("fsdp+tp", {"all_gather", "reduce_scatter"})):
        tp = runs[name]
        assert tp["world_size"] == 4 and tp["replicas_consistent"] and tp["replicas_consistent_after_step1"], tp
        assert abs(tp["final_loss"] - ddp["final_loss"]) <= 1e-5 * abs(ddp["final_loss"]), (name, tp, ddp)
        assert tp["tp_size"] == 2 and tp["dp_size"] == 2 and tp["micro_batches"] == [8, 8] and tp["accum_steps"] == 2
        # the blocks' weights halved inside a node (fsdp+tp: and halved again across nodes)
        params = ddp["state_bytes"]["params"] - blocks / 2 if name == "tp" else (ddp["state_bytes"]["params"] - blocks / 2) / 2
        assert abs(tp["state_bytes"]["params"] - params) < 2048, (name, tp["state_bytes"], ddp["state_bytes"])
        # 4 all-reduces of a micro-batch's activations (8 x 64 x 64 fp32) a block and micro-batch, as the cost model counts
        calls = tp["collectives_per_step"]
        assert set(calls) == across | {"tp_all_reduce"}, calls
        assert calls["tp_all_reduce"]["calls"] == 4 * 2 * 2 and calls["tp_all_reduce"]["bytes"] == 16 * 8 * 64 * 64 * 4
        assert "16 all-reduces inside the node" in tp["printed"] and "the cost model counts 16" in tp["printed"]
        assert tp["predicted_step_ms"] > tp["step_model"]["calibration"]["tp_all_reduce_ms"] > 0


def test_a_pipeline_of_three_stages_ends_at_ddps_loss_in_either_order(tmp_path):
    """--strategy pp against DDP on the same global batches (24 a step): 1F1B on an even split, GPipe on
    stages sized by hand, both within float32's last digits of DDP's loss (the same micro-batch
    gradients summed in another order)."""
    common = ("--steps", "6", "--n-layer", "4", "--micro-batches", "6")
    ddp, _ = train(tmp_path / "ddp", 3, "--steps", "6", "--n-layer", "4")
    for schedule, layers, blocks in (("1f1b", None, [[0, 1], [2, 2], [3, 3]]),
                                     ("gpipe", "1,1,2", [[0, 0], [1, 1], [2, 3]])):
        flags = ["--strategy", "pp", "--schedule", schedule, *common] + (["--stage-layers", layers] if layers else [])
        pp, out = train(tmp_path / schedule, 3, *flags)
        assert abs(pp["final_loss"] - ddp["final_loss"]) <= 1e-5 * abs(ddp["final_loss"]), (schedule, pp, ddp)
        assert pp["strategy"] == "pp" and pp["schedule"] == schedule and pp["accum_steps"] == 6
        assert [s["blocks"] for s in pp["stages"]] == blocks, pp["stages"]
        assert [s["also"] for s in pp["stages"]] == [["embeddings"], [], ["head"]]
        # every stage its own share, the tied embedding held twice (the first stage's and the last's)
        tied = pp["vocab"] * 64
        assert sum(s["params"] for s in pp["stages"]) == pp["params"] + tied, pp["stages"]
        # fp32 weights, gradients and Adam's two moments, and Adam's step count per tensor
        assert all(0 < s["state_bytes"] - 16 * s["params"] < 4096 for s in pp["stages"]), pp["stages"]
        assert pp["replicas_consistent"] and pp["tied_embedding_consistent"], pp
        assert pp["bubble_fraction"] == round(2 / 8, 4)
        # its step predicted before the first: sampled from its own schedule, and played out from its stages'
        # forward and backward and its transfers
        calibration = pp["step_model"]["calibration"]
        assert "= the schedule sampled" in out and pp["predicted_step_ms"] > calibration["played_out_ms"] > 0, out[-2000:]
        assert len(calibration["stage_ms"]) == 3 and len(calibration["transfer_ms"]) == 2
