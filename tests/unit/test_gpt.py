"""The gpt workload: corpus preparation, windows, the model, and a short run that learns."""

import json
import math
import os

import pytest
import torch

from trainer import corpus, gpt
from trainer.train import main

TINY = ["--workload", "gpt", "--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--block-size", "16",
        "--corpus-chars", "20000", "--micro-batch", "4", "--lr", "0.01"]


@pytest.fixture
def no_launcher_env(monkeypatch):
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
                "DDPLAB_RUN_DIR", "DDPLAB_DATA_DIR"):
        monkeypatch.delenv(var, raising=False)


def test_corpus_is_prepared_once_atomically_and_deterministically(tmp_path):
    path = gpt.prepare_corpus(tmp_path, 20_000)
    first = path.stat().st_mtime_ns
    assert gpt.prepare_corpus(tmp_path, 20_000) == path and path.stat().st_mtime_ns == first  # not rewritten
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left behind
    # named by the pinned hash, so a data dir holding text of another corpus.py is never reused
    assert path.name == f"corpus-{corpus.CORPUS_SHA256[:12]}-20000.pt"
    data = gpt.load_corpus(path)
    assert len(data["tokens"]) == 20_000 and data["tokens"].dtype == torch.uint8
    again = gpt.encode(corpus.build(20_000))
    assert again["sha256"] == data["sha256"] and torch.equal(again["tokens"], data["tokens"])
    text = "".join(data["vocab"][i] for i in data["tokens"][:1000].tolist())
    assert "def " in text and "return " in text  # Python-like source


def test_windows_shift_targets_by_one():
    tokens = torch.arange(100, dtype=torch.uint8)
    windows = gpt.TextWindows(tokens, block_size=8)
    assert windows.n_samples == 92
    x, y = windows.batch(torch.tensor([0, 50]))
    assert x.shape == y.shape == (2, 8)
    assert torch.equal(x[1], torch.arange(50, 58)) and torch.equal(y[1], torch.arange(51, 59))


def test_model_starts_near_uniform_and_checks_heads():
    torch.manual_seed(0)
    model = gpt.GPT(vocab_size=50, block_size=16, n_layer=1, n_embd=32, n_head=4)
    logits = model(torch.randint(0, 50, (2, 16)))
    assert logits.shape == (2, 16, 50)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 50), torch.randint(0, 50, (32,)))
    assert abs(loss.item() - math.log(50)) < 0.2
    with pytest.raises(ValueError, match="--n-embd 30 is not divisible by --n-head 4"):
        gpt.GPT(50, 16, 1, 30, 4)


def test_gpt_run_learns_and_reports_throughput(tmp_path, no_launcher_env):
    summary = main(TINY + ["--steps", "30", "--data-dir", str(tmp_path / "data"), "--run-dir", str(tmp_path / "run")])
    assert summary["workload"] == "gpt" and summary["global_batch"] == 4  # micro-batch x world size 1
    assert summary["final_loss"] < math.log(summary["vocab"]) - 0.5
    assert summary["tokens_per_s"] > 0 and summary["compute_ms_per_step"] > 0
    assert summary["comm_fraction"] == 0.0 and summary["allreduce_ms_per_step"] == 0.0
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics-rank0.jsonl").read_text().splitlines()]
    records = [r for r in records if r["kind"] == "step"]  # not the two "clock" records
    assert [r["step"] for r in records] == list(range(1, 31))
    for r in records:
        assert r["tokens"] == 4 * 16 and r["step_ms"] <= r["wall_ms"]
        assert r["compute_ms"] > 0 and r["tokens_per_s"] > 0
    assert "loss" in records[-1]


def test_bad_gpt_shapes_exit_with_a_message(tmp_path, no_launcher_env):
    with pytest.raises(SystemExit, match="not divisible by --n-head 3"):
        main(TINY + ["--n-head", "3", "--steps", "1", "--data-dir", str(tmp_path), "--no-metrics"])


def test_unwritable_data_dir_is_named(tmp_path, no_launcher_env):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(SystemExit, match=str(blocker / "sub")):
        main(TINY + ["--steps", "1", "--data-dir", str(blocker / "sub"), "--no-metrics"])


def test_profile_writes_a_chrome_trace(tmp_path, no_launcher_env):
    main(TINY + ["--steps", "6", "--data-dir", str(tmp_path / "data"), "--run-dir", str(tmp_path / "run"), "--profile"])
    trace = json.loads((tmp_path / "run" / "trace-rank0.json").read_text())
    names = {e.get("name", "") for e in trace["traceEvents"]}
    assert any("aten::" in n for n in names) and any("ProfilerStep" in n for n in names)


def test_data_dir_defaults(monkeypatch, tmp_path):
    from trainer.workloads import resolve_data_dir

    monkeypatch.setenv("DDPLAB_DATA_DIR", str(tmp_path))
    assert resolve_data_dir(None) == tmp_path
    assert resolve_data_dir("x") == type(tmp_path)("x")
    monkeypatch.delenv("DDPLAB_DATA_DIR")
    expected = "/shared/ddplab-data" if os.access("/shared", os.W_OK) else str(type(tmp_path).home() / ".cache" / "ddplab")
    assert str(resolve_data_dir(None)) == expected
