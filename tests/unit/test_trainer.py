"""Unit tests for the DDP trainer: flags, data, a single-process run (torchrun x2: tests/host/test_trainer.py)."""

import json
import re
import subprocess
import sys

import pytest
import torch

from trainer.data import make_dataset
from trainer.train import main, parse_args
from hostrun import LAUNCH_VARS, REPO, host_env

SMALL = ["--samples", "512", "--features", "8", "--classes", "3", "--hidden", "16",
         "--batch-size", "32", "--lr", "0.01"]


@pytest.fixture
def no_launcher_env(monkeypatch):
    for var in LAUNCH_VARS:
        monkeypatch.delenv(var, raising=False)


# (a) flags ------------------------------------------------------------------

@pytest.mark.parametrize("argv", [
    ["--epochs", "0"],
    ["--batch-size", "0"],
    ["--batch-size", "-3"],
    ["--lr", "0"],
    ["--lr", "nan"],
    ["--timeout-s", "0"],
    ["--timeout-s", "inf"],
    ["--log-every", "-1"],
    ["--classes", "1"],
    ["--epochs", "two"],
    ["--no-such-flag"],
])
def test_parse_args_rejects_bad_values(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    flag = argv[0]
    assert flag in capsys.readouterr().err


def test_parse_args_defaults_and_good_values():
    args = parse_args([])
    assert (args.epochs, args.batch_size, args.seed) == (3, 64, 0)
    assert (args.timeout_s, args.log_every) == (120.0, 0)
    assert args.run_dir is None
    args = parse_args(["--epochs", "1", "--batch-size", "8", "--lr", "1e-3", "--timeout-s", "5",
                       "--log-every", "10", "--run-dir", "x", "--seed", "-1"])
    assert (args.epochs, args.batch_size, args.lr, args.timeout_s) == (1, 8, 1e-3, 5.0)
    assert (args.log_every, args.run_dir, args.seed) == (10, "x", -1)


# (b) data -------------------------------------------------------------------

def test_dataset_is_deterministic_per_seed():
    a = make_dataset(256, 8, 4, seed=3).tensors
    b = make_dataset(256, 8, 4, seed=3).tensors
    c = make_dataset(256, 8, 4, seed=4).tensors
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])
    assert not torch.equal(a[1], c[1])
    x, y = a
    assert x.shape == (256, 8) and x.dtype == torch.float32
    assert y.shape == (256,) and y.dtype == torch.int64
    assert y.min() >= 0 and y.max() < 4
    assert len(y.unique()) > 1  # a teacher that emits one class teaches nothing


def test_dataset_leaves_global_rng_alone():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    make_dataset(64, 4, 2, seed=9)
    assert torch.equal(torch.rand(3), expected)


# (c) single process, in-process -------------------------------------------------

def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_single_process_run_writes_metrics_and_learns(tmp_path, no_launcher_env, capsys):
    summary = main(SMALL + ["--epochs", "4", "--log-every", "5", "--run-dir", str(tmp_path)])
    out = capsys.readouterr().out

    assert summary["world_size"] == 1
    assert summary["replicas_consistent"] is True
    assert summary["steps"] == 4 * (512 // 32)
    assert re.fullmatch(r"[0-9a-f]{16}", summary["param_checksum"])
    summary_lines = [line for line in out.splitlines() if line.startswith("SUMMARY ")]
    assert len(summary_lines) == 1
    assert json.loads(summary_lines[0][len("SUMMARY "):]) == summary

    records = read_jsonl(tmp_path / "metrics-rank0.jsonl")
    epochs = [r for r in records if r["kind"] == "epoch"]
    steps = [r for r in records if r["kind"] == "step"]
    assert [r["epoch"] for r in epochs] == [1, 2, 3, 4]
    assert [r["step"] for r in steps] == list(range(5, summary["steps"] + 1, 5))
    for r in epochs + steps:
        assert {"rank", "epoch", "step", "loss", "samples", "elapsed_s", "time"} <= r.keys()
        assert r["rank"] == 0
    # the clock records open and close the file; without a process group there is no comm time
    assert [(r["kind"], r.get("event")) for r in (records[0], records[-1])] == [("clock", "start"), ("clock", "end")]
    assert records[0]["t"] <= steps[0]["t_start"] < steps[0]["t_backward_end"] <= steps[0]["t_end"] <= records[-1]["t"]
    assert steps[0]["t_comm_start"] is None and steps[0]["t_comm_end"] is None
    losses = [r["loss"] for r in epochs]
    assert losses[-1] < 0.7 * losses[0], losses
    assert summary["final_loss"] == pytest.approx(losses[-1], abs=1e-5)
    # the step model's prediction, printed before step 1 and checked after the last
    model = summary["step_model"]
    parts = model["compute_ms"] + model["waiting_ms"] + model["optimizer_ms"]
    assert summary["predicted_step_ms"] == pytest.approx(parts, abs=3e-3)
    assert summary["step_model_error"] == pytest.approx(summary["step_ms"] / summary["predicted_step_ms"] - 1, abs=1e-3)
    assert model["calibration"]["link"] == {} and summary["predicted_exposed_comm_ms"] == 0.0
    # each with its spread: the band from the calibration's p10 and p90 steps, the run's own p10 and p90
    low, high = summary["predicted_step_ms_band"]
    assert low <= summary["predicted_step_ms"] <= high and low < high
    assert summary["step_ms_p10"] <= summary["step_ms_p90"] and summary["step_ms_p10"] < summary["step_ms"] * 1.5
    # a step shorter than the noise measured around it (a band wider than the step) is not predicted
    assert summary["step_model_trusted"] is (high - low <= summary["predicted_step_ms"])
    if not summary["step_model_trusted"]:
        assert re.search(rf"step model: too short to predict: its calibration spreads it from {low:.1f} to {high:.1f} ms", out)
        assert re.search(r"step model: measured [\d.]+ ms a step \(p10-p90 [\d.]+-[\d.]+\), not predicted: too short", out)
        return
    assert re.search(r"step model: predicted [\d.]+ ms a step = compute", out)
    inside = [low <= summary["step_ms"] <= high, summary["step_ms_p10"] <= summary["predicted_step_ms"] <= summary["step_ms_p90"]]
    verdict = {(True, True): "each within the other's spread", (True, False): "the measured step within the band",
               (False, True): "the prediction within the measured spread", (False, False): "neither within"}[tuple(inside)]
    assert re.search(rf"step model: predicted [\d.]+ ms a step \([\d.]+-[\d.]+\), measured [\d.]+ \(p10-p90 "
                     rf"[\d.]+-[\d.]+\) \([+-][\d.]+%\), {verdict}", out), out


def test_same_seed_same_weights(tmp_path, no_launcher_env):
    a = main(SMALL + ["--epochs", "1", "--no-metrics"])
    b = main(SMALL + ["--epochs", "1", "--no-metrics"])
    c = main(SMALL + ["--epochs", "1", "--no-metrics", "--seed", "1"])
    assert a["param_checksum"] == b["param_checksum"] != c["param_checksum"]


def test_run_dir_from_env(tmp_path, no_launcher_env, monkeypatch):
    monkeypatch.setenv("DDPLAB_RUN_DIR", str(tmp_path / "from-env"))
    main(SMALL + ["--epochs", "1"])
    assert (tmp_path / "from-env" / "metrics-rank0.jsonl").exists()


def test_unwritable_run_dir_names_the_path(tmp_path, no_launcher_env):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(SystemExit) as exc:
        main(SMALL + ["--run-dir", str(blocker / "sub")])
    assert str(blocker / "sub") in str(exc.value.code)


# --- DDP levers: hooks wired on a real (world size 1, gloo) process group, in a process of its own ---

@pytest.fixture(scope="module")
def hooks_world_of_one():
    """tests/unit/hooks_world_of_one.py's answer: each hook's losses and bf16's refusal (that file
    says why the group lives and ends in a process of its own)."""
    done = subprocess.run([sys.executable, str(REPO / "tests" / "unit" / "hooks_world_of_one.py")], cwd=REPO,
                          env=host_env(PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("hook", ["none", "fp16", "powersgd"])
def test_comm_hooks_train(hooks_world_of_one, hook):
    losses = hooks_world_of_one["losses"][hook]
    assert len(losses) == 5 and losses[-1] < losses[0]


def test_bf16_hook_on_gloo_is_refused_clearly(hooks_world_of_one):
    assert "needs CUDA and NCCL" in hooks_world_of_one["bf16"]
