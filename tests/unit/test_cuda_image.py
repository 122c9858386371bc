"""The CUDA node image: Dockerfile.cuda is the CPU node with torch's CUDA build, and its inputs and
wheels are kept apart from the CPU image's. The image itself is built and trained on by
tests/integration/test_cuda_nodes.py."""

from __future__ import annotations

import re
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from labctl.core import assets
from labctl.image import image
from labctl.spec.labspec import LabSpec, cuda_tag

REPO = Path(__file__).resolve().parents[2]


def instructions(path: Path) -> list[str]:
    """The Dockerfile's instructions, continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", "\n".join(line for line in path.read_text().splitlines()
                                         if not line.lstrip().startswith("#")))
    return [" ".join(line.split()) for line in text.splitlines() if line.strip()]


def test_the_cuda_image_is_the_cpu_node_plus_cuda_and_nothing_else():
    cpu, cuda = instructions(REPO / "Dockerfile"), instructions(REPO / "Dockerfile.cuda")
    cpu_only = [i for i in cpu if i not in cuda]
    cuda_only = [i for i in cuda if i not in cpu]
    # Only the import check (CUDA and NCCL besides gloo) and the label differ; every tool, user,
    # entry point, environment variable and copy of the node is the same, in the same order.
    assert [i.split()[0] for i in cpu_only] == ["RUN", "LABEL"], cpu_only
    assert [i.split()[0] for i in cuda_only] == ["ENV", "RUN", "LABEL"], cuda_only
    assert cuda_only[0] == "ENV NVIDIA_DRIVER_CAPABILITIES=compute,utility"
    assert "NVIDIA_VISIBLE_DEVICES" not in " ".join(cuda), "a node gets a GPU only when up --gpus reserves one"
    assert "torch.version.cuda" in cuda_only[1] and "is_nccl_available" in cuda_only[1]
    assert cuda_only[2].startswith(cpu_only[1]) and 'io.ddplab.variant="cuda"' in cuda_only[2]
    assert [i for i in cpu if i in cuda] == [i for i in cuda if i in cpu], "shared instructions in another order"


def test_a_cuda_build_rules_out_the_cpu_wheel_of_the_same_release():
    torch, numpy = image.wheel_requirements("2.13.0", cuda=True)
    spec = SpecifierSet(torch.removeprefix("torch"))
    assert Version("2.13.0+cu130") in spec and Version("2.13.0") in spec and Version("2.13.0+cu126") in spec
    assert Version("2.13.0+cpu") not in spec and Version("2.14.1") not in spec
    assert numpy == "numpy"
    assert image.wheel_requirements("2.13.0") == ["torch==2.13.0", "numpy"]


def test_each_release_builds_in_a_context_of_its_own_outside_the_checkout(tmp_path):
    first = assets.cuda_build_context(str(tmp_path), "2.13.0")
    other = assets.cuda_build_context(str(tmp_path), "2.14.1")
    assert first.parent == other.parent == tmp_path and first != other
    assert assets.cuda_build_context("", "2.13.0").parent == REPO / ".lab"  # the checkout's cache, not its top
    assert "build-cuda" not in (REPO / ".dockerignore").read_text(), "the CPU build must not send the CUDA wheels"


def test_the_cuda_image_hashes_its_own_dockerfile(tmp_path):
    context = assets.prepare_build_context(tmp_path / "ctx", REPO)
    cuda_inputs = image.image_inputs(context, image.dockerfile_name(True))
    assert context / "Dockerfile.cuda" in cuda_inputs and context / "Dockerfile" not in cuda_inputs
    args = {"TORCH_VERSION": "2.13.0"}
    assert image.build_hash(cuda_inputs, [], args, context) != image.build_hash(image.image_inputs(context), [], args,
                                                                                context)


def test_tags():
    config = LabSpec()
    assert config.cuda_image_tag == image.image_tag(config, cuda=True) == "ddplab-node:torch2.13.0-cuda"
    assert image.image_tag(config) == config.image_tag == "ddplab-node:torch2.13.0-cpu"
    assert cuda_tag(image.MISMATCH_VERSION) == "ddplab-node:torch2.14.1-cuda"  # the version-mismatch node's
