"""The CUDA node image on a machine without a GPU: a lab of CUDA-image nodes trains with gloo on CPU,
and the same lab with one node on the CPU image (`up --cuda 2`) passes doctor and trains to the same
loss and parameters: one torch release, two builds, one backend everywhere."""

from __future__ import annotations

import json

from conftest import labctl, summary_of

TRAIN = ("--", "-m", "trainer", "--steps", "40")


def images_of(docker_client, lab: str) -> dict[str, str]:
    containers = docker_client.api.containers(all=True, filters={"label": [f"io.ddplab.lab={lab}", "io.ddplab.node"]})
    return {c["Labels"]["io.ddplab.node"]: c["Image"] for c in containers}


def test_cuda_image_nodes_train_with_gloo_alone_and_beside_a_cpu_node(lab_name, docker_client, node_image, cuda_image):
    up = labctl("up", "--lab", lab_name, "--nodes", "3", "--cuda", "all", "--json", check=True)
    nodes = json.loads(up.stdout)["nodes"]
    assert [n["name"] for n in nodes] == ["node0", "node1", "node2"]
    assert all("+cpu" not in n["torch"] for n in nodes), nodes  # the CUDA build: 2.13.0+cu130 from PyPI
    assert set(images_of(docker_client, lab_name).values()) == {cuda_image}
    all_cuda = summary_of(labctl("run", "--lab", lab_name, *TRAIN, timeout=600, check=True).stdout)
    assert all_cuda["backend"] == "gloo" and all_cuda["world_size"] == 3 and all_cuda["replicas_consistent"]

    # Reconciled: node2 goes over to the CPU image, the others stay as they are.
    up = labctl("up", "--lab", lab_name, "--cuda", "2", "--json", check=True)
    torch = {n["name"]: n["torch"] for n in json.loads(up.stdout)["nodes"]}
    assert "+cpu" in torch["node2"] and "+cpu" not in torch["node0"] and "+cpu" not in torch["node1"], torch
    assert torch["node0"].split("+")[0] == torch["node2"].split("+")[0], "one release on every node"
    assert images_of(docker_client, lab_name) == {"node0": cuda_image, "node1": cuda_image, "node2": node_image}
    doctor = labctl("doctor", "--lab", lab_name)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    mixed = summary_of(labctl("run", "--lab", lab_name, *TRAIN, timeout=600, check=True).stdout)
    assert mixed["backend"] == "gloo" and mixed["replicas_consistent"]
    assert (mixed["final_loss"], mixed["param_checksum"]) == (all_cuda["final_loss"], all_cuda["param_checksum"])
