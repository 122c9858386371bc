"""Checkpoints: atomic, pruned, a damaged newest one skipped, and a resumed run identical to an
uninterrupted one."""

import pytest
import torch

from trainer import checkpoint
from trainer.train import main


def test_save_is_atomic_pruned_and_loads_the_newest(tmp_path):
    for step in (10, 20, 30):
        checkpoint.save(tmp_path, step, {"x": torch.tensor([float(step)])}, keep=2)
    assert [s for s, _ in checkpoint.checkpoints(tmp_path)] == [30, 20]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    state, path, problems = checkpoint.load_latest(tmp_path)
    assert state["step"] == 30 and state["x"].item() == 30.0 and path.name == "step-30.pt" and problems == []


def test_a_torn_or_damaged_checkpoint_is_never_loaded(tmp_path):
    checkpoint.save(tmp_path, 10, {"x": torch.tensor([1.0])})
    (tmp_path / ".step-20.pt.123.tmp").write_bytes(b"half a checkpo")  # a crash mid-write: ignored
    (tmp_path / "step-30.pt").write_bytes(b"not a checkpoint")  # damaged some other way: skipped, said
    state, path, problems = checkpoint.load_latest(tmp_path)
    assert state["step"] == 10 and path.name == "step-10.pt"
    assert len(problems) == 1 and problems[0].startswith("step-30.pt")
    assert checkpoint.load_latest(tmp_path / "missing") == (None, None, [])


ARGS = ["--global-batch", "32", "--micro-batch", "8", "--steps", "12", "--ckpt-every", "4", "--no-metrics"]


def test_resumed_run_matches_an_uninterrupted_one(tmp_path, monkeypatch):
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "DDPLAB_RUN_DIR"):
        monkeypatch.delenv(var, raising=False)
    reference = main(ARGS + ["--run-dir", str(tmp_path / "a")])
    assert reference["resumed_from_step"] == 0
    assert [s for s, _ in checkpoint.checkpoints(tmp_path / "a" / "checkpoints")] == [8, 4]
    # a run that "died" after step 8 leaves step-8.pt; the next attempt starts at step 9
    (tmp_path / "a" / "checkpoints" / "step-8.pt").rename(tmp_path / "keep.pt")
    interrupted_dir = tmp_path / "b" / "checkpoints"
    interrupted_dir.mkdir(parents=True)
    (tmp_path / "keep.pt").rename(interrupted_dir / "step-8.pt")
    resumed = main(ARGS + ["--run-dir", str(tmp_path / "b")])
    assert resumed["resumed_from_step"] == 8
    assert resumed["param_checksum"] == reference["param_checksum"]
    assert resumed["final_loss"] == reference["final_loss"]


def test_a_checkpoint_of_another_run_is_refused(tmp_path, monkeypatch):
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "DDPLAB_RUN_DIR"):
        monkeypatch.delenv(var, raising=False)
    main(ARGS + ["--run-dir", str(tmp_path)])
    with pytest.raises(SystemExit, match="global batch 32.*this run is toy, 16"):
        main(["--global-batch", "16", "--steps", "12", "--ckpt-every", "4", "--no-metrics", "--run-dir", str(tmp_path)])
    with pytest.raises(SystemExit, match="needs global-batch mode"):
        main(["--epochs", "1", "--ckpt-every", "4", "--no-metrics"])
