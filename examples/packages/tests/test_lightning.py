"""A PyTorch Lightning job on a lab whose nodes have Lightning: the marker names the requirements,
the plugin brings the lab up with them (resolved once, one package image for every node)."""

from pathlib import Path

import pytest

SCRIPT = str(Path(__file__).resolve().parents[1] / "lightning_ddp.py")


@pytest.mark.ddplab(nodes=3, requirements="requirements.txt")  # this folder's, beside pytest.ini
def test_lightning_trains_every_replica_to_the_same_parameters(ddp_lab):
    summary = ddp_lab.run(SCRIPT, "--epochs", "1", echo=False).summary
    assert summary["world_size"] == 3 and len(summary["checksums"]) == 3
    assert summary["replicas_consistent"], summary["checksums"]
