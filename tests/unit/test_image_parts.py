"""The node image in two parts (labctl/image/image.py): the runtime (torch installed), tagged by a hash
that the node's own files are not part of, and those files, built on it from a context of their own.
tests/integration/test_build_parts.py builds both on a real engine."""

from __future__ import annotations

import io
import re
import tarfile
from pathlib import Path

import pytest

from labctl.core import assets
from labctl.errors import LabError
from labctl.image import image

REPO = Path(__file__).resolve().parents[2]
ARGS = {"BASE_IMAGE": "python:3.11-slim-bookworm", "TORCH_VERSION": "2.13.0"}
WHEELS = ["torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl", "numpy-2.3.5-cp311-cp311-manylinux.whl"]


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.cuda"])
def test_each_dockerfile_installs_torch_before_the_cut_and_copies_the_nodes_files_after_it(dockerfile):
    runtime, top = image.split_dockerfile((REPO / dockerfile).read_text(), dockerfile)
    assert "AS runtime" in runtime and "pip install" in runtime and "import torch" in runtime
    assert "COPY trainer /opt/ddplab/trainer" in top and "COPY compose/node-entrypoint.sh" in top
    assert not re.search(r"^FROM ", top, re.M) and "pip" not in top and "import torch" not in top
    # every file the steps after the cut copy is among node_files, which their context holds
    sources = [s for line in top.splitlines() if line.startswith("COPY ") for s in line.split()[1:-1]]
    names = {str(p.relative_to(REPO)) for p in image.node_files(REPO)}
    assert all(s in names or any(n.startswith(s + "/") for n in names) for s in sources), (sources, names)


def test_the_runtime_hash_leaves_the_nodes_files_out_and_the_image_hash_does_not(tmp_path):
    context = assets.prepare_build_context(tmp_path / "ctx", REPO)
    text = (context / "Dockerfile").read_text()
    before = (image.build_hash(image.image_inputs(context), WHEELS, ARGS, context),
              image.runtime_hash("Dockerfile", text, WHEELS, ARGS))
    (context / "trainer" / "train.py").write_text((context / "trainer" / "train.py").read_text() + "# edited\n")
    (context / "trainer" / "notes.txt").write_text("a file the COPY takes too\n")
    after = (image.build_hash(image.image_inputs(context), WHEELS, ARGS, context),
             image.runtime_hash("Dockerfile", text, WHEELS, ARGS))
    assert after[0] != before[0] and after[1] == before[1]
    # what the runtime is made of does change it
    assert image.runtime_hash("Dockerfile", text, WHEELS[:1], ARGS) != before[1]
    assert image.runtime_hash("Dockerfile", text, WHEELS, {**ARGS, "TORCH_VERSION": "2.14.1"}) != before[1]
    assert image.runtime_hash("Dockerfile", text.replace("numpy", "numpy scipy", 1), WHEELS, ARGS) != before[1]
    assert image.runtime_hash("Dockerfile.cuda", (context / "Dockerfile.cuda").read_text(), WHEELS, ARGS) != before[1]


def test_the_nodes_files_are_built_from_a_context_of_their_own_on_the_runtime_image(tmp_path):
    context = assets.prepare_build_context(tmp_path / "ctx", REPO)
    (context / "trainer" / "__pycache__").mkdir(exist_ok=True)
    (context / "trainer" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"stale")
    data, args = image.node_files_context(context, "Dockerfile.cuda", "ddplab-runtime:0123456789abcdef", ARGS)
    assert args == {"TORCH_VERSION": "2.13.0"}  # BASE_IMAGE is the runtime's: the engine would warn of it
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = {m.name: m for m in tar.getmembers()}
        dockerfile = tar.extractfile("Dockerfile").read().decode()
    assert dockerfile.startswith("FROM ddplab-runtime:0123456789abcdef\nARG TORCH_VERSION=")
    assert dockerfile.endswith(image.split_dockerfile((context / "Dockerfile.cuda").read_text())[1])
    assert 'io.ddplab.variant="cuda"' in dockerfile
    assert set(members) == {"Dockerfile", *(str(p.relative_to(context)) for p in image.node_files(context))}
    assert not any("__pycache__" in name or name.endswith(".pyc") for name in members)
    assert members["compose/node-entrypoint.sh"].mode & 0o111, "the nodes' entry point must stay executable"
    assert "trainer/train.py" in members and "Dockerfile.cuda" not in members and ".lab/wheelhouse" not in members


@pytest.mark.parametrize("text, count", [("FROM base\nCOPY trainer /t\n", 0),
                                         ("FROM base AS runtime\nFROM runtime\nRUN x\nFROM runtime\n", 2)])
def test_a_dockerfile_without_one_cut_is_refused_saying_why(text, count):
    with pytest.raises(LabError) as caught:
        image.split_dockerfile(text, "Dockerfile")
    assert re.match(rf"Dockerfile has {count} lines `FROM runtime`", str(caught.value))
    assert "named `runtime`" in caught.value.hint
