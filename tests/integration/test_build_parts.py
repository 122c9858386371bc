"""A change to the trainer is built on the runtime image the checkout's build left (ddplab-runtime:HASH),
in seconds and without the wheels: in a copy of this workspace whose wheelhouse holds only their
names (as after `labctl build --lean`, which CI's CUDA builds use), with one line added to the
trainer, `labctl build` reuses the runtime, builds the node's files on it, and the image has both;
after another change, the image the tag named before goes, unless a container still uses it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from conftest import REPO, copy_workspace, labctl
from labctl.image.image import LABEL_BUILD_HASH
from labctl.image.wheelhouse import STAMP, read_stamp

pytestmark = pytest.mark.integration


def test_a_trainer_change_is_built_on_the_runtime_without_the_wheels(tmp_path, docker_client, node_image):
    checkout = json.loads(labctl("build", "--print-hash", "--json", check=True).stdout)
    assert checkout["up_to_date"], "make test builds the checkout's image first"
    runtime = docker_client.images.get(checkout["runtime"])  # that build left its runtime tagged

    copy = copy_workspace(tmp_path / "ddplab")
    ours = REPO / ".lab" / "wheelhouse"
    names = read_stamp(ours).get("wheels") or sorted(p.name for p in ours.glob("*.whl"))
    (copy / ".lab" / "wheelhouse").mkdir(parents=True)
    (copy / ".lab" / "wheelhouse" / STAMP).write_text(json.dumps({**read_stamp(ours), "wheels": names}))
    token = uuid.uuid4().hex
    tag = f"ddplab-node:it-parts-{token[:8]}"
    # `python -m labctl` in the copy runs the copy's labctl, which builds from the copy
    env = {**os.environ, "DDPLAB_IMAGE": tag, "COLUMNS": "200"}
    env.pop("DDPLAB_CACHE_DIR", None)

    def build(change: str) -> str:
        """A line added to the copy's trainer, then `labctl build` there: what it said."""
        with (copy / "trainer" / "train.py").open("a") as train:
            train.write(f"# {change}\n")
        done = subprocess.run([sys.executable, "-m", "labctl", "build"], cwd=copy, env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stderr

    first = None
    try:
        said = build(token)
        reused = f"torch and its packages are built ({checkout['runtime']}); building the node's files on it"
        assert reused in said, said
        assert "wheelhouse:" not in said and not list((copy / ".lab" / "wheelhouse").glob("*.whl"))
        first = docker_client.images.get(tag)
        assert first.labels[LABEL_BUILD_HASH] != checkout["hash"]
        assert runtime.id in [layer["Id"] for layer in docker_client.api.history(tag)]
        out = docker_client.containers.run(
            tag, ["sh", "-c", "tail -n 1 /opt/ddplab/trainer/train.py && python -c 'import torch, trainer.train; "
                              "print(torch.__version__)'"], entrypoint=[], remove=True).decode().split()
        assert out == ["#", token, "2.13.0+cpu"], out

        # another change: the image the tag named before goes once nothing uses it; the runtime stays
        user = docker_client.containers.create(tag, ["true"], entrypoint=[])  # as a lab's node would
        try:
            assert f"image: kept the image {tag} named before ({first.short_id[7:]})" in build("two")
        finally:
            user.remove()
        second = docker_client.images.get(tag)
        said = build("three")
        assert f"image: removed the image {tag} named before ({second.short_id[7:]}), which nothing names now" in said
        assert not docker_client.api.images(filters={"label": f"{LABEL_BUILD_HASH}={second.labels[LABEL_BUILD_HASH]}"})
        assert docker_client.images.get(checkout["runtime"]).id == runtime.id
    finally:
        subprocess.run(["docker", "rmi", tag, *([first.id] if first else [])], capture_output=True)
