"""Compose itself accepts every GPU form labctl renders (device reservations, shm_size, ulimits):
the golden files, validated by `docker compose config`, as `up` would hand them over."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


@pytest.mark.parametrize("golden", sorted(GOLDEN.glob("compose-gpus-*.yaml")), ids=lambda p: p.stem)
def test_compose_accepts_the_gpu_project(golden, tmp_path):
    project = tmp_path / "compose.yaml"
    shutil.copy(golden, project)
    for n in range(8):  # the env files the project names (their content is not read by `config`)
        (tmp_path / f"node{n}.env").write_text("")
    result = subprocess.run(["docker", "compose", "-f", str(project), "config", "--format", "json"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    services = json.loads(result.stdout)["services"]
    reserved = {name: s["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]
                for name, s in services.items() if s.get("deploy")}
    expected = {name: s["labels"]["io.ddplab.gpus"].split(",") for name, s in services.items()
                if s["labels"].get("io.ddplab.gpus")}
    assert reserved == expected and all(services[n]["shm_size"] for n in reserved)
