"""`labctl k8s` end to end on a 3-node lab: the TrainJob and the JobSet that `k8s export` writes
pass the APIs' schemas, and `k8s run` of each ends at the very loss `labctl run` of the same job
ends at; a TrainJob written by hand as Kubeflow's examples write one (plain `python`, a script path,
its env, CPU and memory per node) runs on 2 of the nodes with world size 2, the nodes' limits set
from it for the run and given back after; a failing pod ends the run as `labctl run` ends."""

from __future__ import annotations

import json

import pytest
import yaml

from conftest import REPO, labctl, summary_of
from labctl.engine.labels import container_name
from labctl.k8s.schema import schema_errors

TRAIN = ["-m", "trainer", "--epochs", "1"]


@pytest.fixture(scope="module")
def lab_loss(lab3):
    name, _ = lab3
    return summary_of(labctl("run", "--lab", name, "--", *TRAIN, check=True).stdout)["final_loss"]


@pytest.mark.parametrize("kind", ["trainjob", "jobset"])
def test_an_exported_manifest_passes_the_schema_and_runs_to_labctl_runs_loss(lab3, lab_loss, kind, tmp_path):
    name, _ = lab3
    path = tmp_path / f"{kind}.yaml"
    labctl("k8s", "export", "--lab", name, "--kind", kind, "-o", str(path), "--", *TRAIN, check=True)
    doc = yaml.safe_load(path.read_text())
    assert schema_errors(doc, doc["kind"]) == []
    nodes = (doc["spec"]["trainer"]["numNodes"] if kind == "trainjob"
             else doc["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"])
    assert nodes == 3
    result = labctl("k8s", "run", "--lab", name, "--json", str(path), check=True)
    run = json.loads(result.stdout)
    assert run["exit_status"] == 0 and run["summary"]["world_size"] == 3
    assert run["summary"]["final_loss"] == lab_loss  # the same job: the same loss, to the last digit


def test_a_handwritten_kubeflow_style_trainjob_runs_with_world_size_2(lab3, docker_client):
    name, _ = lab3
    nodes = [docker_client.api.inspect_container(container_name(name, f"node{i}"))["HostConfig"] for i in range(3)]
    manifest = REPO / "examples" / "kubernetes" / "trainjob.yaml"
    plan = labctl("k8s", "run", "--lab", name, "--dry-run", str(manifest), check=True).stdout
    assert "not torchrun" in plan and "1 CPUs, 2 GiB memory" in plan and "node2" not in plan
    result = labctl("k8s", "run", "--lab", name, str(manifest), check=True)
    summary = summary_of(result.stdout)
    assert summary["world_size"] == 2 and summary["replicas_consistent"] is True
    assert "rank 1 of 2, LEARNING_RATE=0.05" in result.stdout + result.stderr
    after = [docker_client.api.inspect_container(container_name(name, f"node{i}"))["HostConfig"] for i in range(3)]
    assert [n["Memory"] for n in after] == [n["Memory"] for n in nodes]  # the lab's limits, given back
    assert [n["MemorySwap"] for n in after] == [n["MemorySwap"] for n in nodes]


def test_a_failing_pod_ends_the_run_as_labctl_run_does(lab3, tmp_path):
    name, _ = lab3
    path = tmp_path / "fails.yaml"
    exit_3_on_rank_1 = "import os, sys; sys.exit(3 if os.environ['PET_NODE_RANK'] == '1' else 0)"
    path.write_text(yaml.safe_dump({
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "fails"},
        "spec": {"runtimeRef": {"name": "torch-distributed"},
                 "trainer": {"numNodes": 2, "command": ["python", "-c", exit_3_on_rank_1]}}}))
    result = labctl("k8s", "run", "--lab", name, str(path))
    assert result.returncode == 3 and "node1" in result.stderr


def test_what_the_lab_cannot_be_is_refused_before_anything_starts(lab3, tmp_path):
    name, _ = lab3

    def manifest(**trainer) -> str:
        path = tmp_path / "job.yaml"
        path.write_text(yaml.safe_dump({
            "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "refused"},
            "spec": {"runtimeRef": {"name": "torch-distributed"},
                     "trainer": {"numNodes": 2, "command": ["torchrun", "train.py"], **trainer}}}))
        return str(path)

    other_torch = labctl("k8s", "run", "--lab", name, manifest(image="pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime"))
    assert other_torch.returncode == 2 and "job.yaml: spec.trainer.image" in other_torch.stderr
    assert "torch 2.7.1" in other_torch.stderr and "--ignore-image" in other_torch.stderr
    too_many = labctl("k8s", "run", "--lab", name, manifest(numNodes=4))
    assert too_many.returncode == 1 and f"labctl up --lab {name} --nodes 4" in too_many.stderr
    no_gpus = labctl("k8s", "run", "--lab", name, manifest(resourcesPerNode={"limits": {"nvidia.com/gpu": 1}}))
    assert no_gpus.returncode == 1 and "GPU" in no_gpus.stderr
    unsaid = labctl("k8s", "run", "--lab", name, "--dry-run", manifest(image="registry.example.com/me/train:v3"))
    assert unsaid.returncode == 0 and "torch not said" in unsaid.stdout
