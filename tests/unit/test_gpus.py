"""GPU nodes without a GPU: the --gpus/--cuda syntax, the plan (each node's GPUs, image, env), the
Compose and env files it renders (golden files: UPDATE_GOLDEN=1 to accept a change), and the
refusals of a machine without GPUs or an engine without the NVIDIA runtime."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from test_render import check_golden

from labctl.api import Lab
from labctl.engine.detect import Engine, classify, gpu_runtime_refusal
from labctl.errors import ConfigError, StateError
from labctl.lab import gpus as gpus_mod
from labctl.lab import up as up_mod
from labctl.lab.compose import ComposePlan, build_compose, load_template, render_compose
from labctl.lab.envfiles import build_env_files, topology_for_lab
from labctl.lab.gpus import Gpu, build_gpu_plan, detect_gpus, parse_nvidia_smi
from labctl.spec.addresses import node_ip
from labctl.spec.labspec import LabSpec, resolve_config
from labctl.spec.parsers import parse_cuda, parse_gpus

# What nvidia-smi --query-gpu=index,name,uuid --format=csv,noheader prints on a 4-GPU machine.
SMI = """0, NVIDIA H100 80GB HBM3, GPU-5d0a3c1e-0000-0000-0000-000000000000
1, NVIDIA H100 80GB HBM3, GPU-5d0a3c1e-0000-0000-0000-000000000001
2, NVIDIA H100 80GB HBM3, GPU-5d0a3c1e-0000-0000-0000-000000000002
3, NVIDIA H100 80GB HBM3, GPU-5d0a3c1e-0000-0000-0000-000000000003
"""
MACHINE = parse_nvidia_smi(SMI)
CPU, CUDA = "ddplab-node:torch2.13.0-cpu", "ddplab-node:torch2.13.0-cuda"


def config(**flags) -> LabSpec:
    return resolve_config(flags={"lab": "demo", **{k: str(v) for k, v in flags.items()}})


def plan(machine=MACHINE, **flags):
    return build_gpu_plan(config(**flags), machine)


# ------------------------------------------------------------------------------------ syntax


@pytest.mark.parametrize("raw, parsed", [
    ("", None), ("none", None), ("0", None), ("all", "all"), ("ALL", "all"), ("2", "2"), (" 0, 2 ", "0,2"),
    ("3,1", "3,1"), ("1,", "1,"), ("7,", "7,"),
])
def test_gpus_syntax(raw, parsed):
    assert parse_gpus(raw) == parsed


@pytest.mark.parametrize("raw, fragment", [
    ("x", "must be all, a count N"), ("1.5", "must be all"), ("-1", "from 1 to 64"), ("65", "from 1 to 64"),
    ("0,0", "names GPU 0 more than once"), ("0,,2", "must be all"), ("0,-1", "must be all"), (",", "must be all"),
    ("0,64", "from 0 to 63"),
])
def test_bad_gpus_are_refused_with_what_is_allowed(raw, fragment):
    with pytest.raises(ConfigError, match=fragment) as caught:
        resolve_config(flags={"gpus": raw})
    assert caught.value.exit_code == 2 and f"--gpus={raw!r}" in str(caught.value)


@pytest.mark.parametrize("raw, parsed", [
    ("", "auto"), ("auto", "auto"), ("all", "all"), ("2", "2"), ("node0, node2", "node0,node2"), ("node1,", "node1"),
])
def test_cuda_syntax(raw, parsed):
    assert parse_cuda(raw) == parsed


@pytest.mark.parametrize("raw, fragment", [
    ("0", "from 1 to 64"), ("node", "must be auto"), ("node01", "must be auto"), ("gpu0", "must be auto"),
    ("node1,node1", "node1 more than once"),
])
def test_bad_cuda_is_refused(raw, fragment):
    with pytest.raises(ConfigError, match=fragment):
        resolve_config(environ={"DDPLAB_CUDA": raw})


def test_bad_per_node_and_transport_are_refused():
    with pytest.raises(ConfigError, match="--gpus-per-node='0': must be from 1 to 16"):
        resolve_config(flags={"gpus_per_node": "0"})
    with pytest.raises(ConfigError, match="DDPLAB_NCCL_TRANSPORT='shm'.*socket, auto"):
        resolve_config(environ={"DDPLAB_NCCL_TRANSPORT": "shm"})


def test_the_api_takes_lists_and_says_one_index_as_a_list(tmp_path):
    lab = Lab("demo", gpus=[1], cuda=["node0", "node1"], gpus_per_node=1, nccl_transport="auto", workspace=tmp_path,
              environ={})
    assert (lab.config.gpus, lab.config.cuda, lab.config.nccl_transport) == ("1,", "node0,node1", "auto")
    assert Lab(gpus=2, workspace=tmp_path, environ={}).config.gpus == "2"
    assert Lab(gpus=(0, 2), workspace=tmp_path, environ={}).config.gpus == "0,2"


# -------------------------------------------------------------------------------------- plan


def shape(gpu_plan) -> list[tuple[str, tuple[int, ...], str]]:
    return [(n.node, n.gpus, n.image) for n in gpu_plan.nodes]


def test_no_gpus_is_every_node_on_the_cpu_image_and_no_env():
    result = plan(None, nodes=3)
    assert shape(result) == [("node0", (), CPU), ("node1", (), CPU), ("node2", (), CPU)]
    assert result.env == {} and result.cuda_nodes == [] and result.gpu_nodes == []


@pytest.mark.parametrize("flags, expected", [
    ({"nodes": 4, "gpus": "all"}, [("node0", (0,)), ("node1", (1,)), ("node2", (2,)), ("node3", (3,))]),
    ({"nodes": 2, "gpus": "2"}, [("node0", (0,)), ("node1", (1,))]),
    ({"nodes": 2, "gpus": "3,1"}, [("node0", (3,)), ("node1", (1,))]),  # in the order given
    ({"nodes": 2, "gpus": "all", "gpus_per_node": 2}, [("node0", (0, 1)), ("node1", (2, 3))]),
    ({"nodes": 3, "gpus": "2,", "cuda": "all"}, [("node0", (2,)), ("node1", ()), ("node2", ())]),
])
def test_nodes_take_the_gpus_in_order(flags, expected):
    result = plan(**flags)
    assert [(n.node, n.gpus) for n in result.nodes] == expected
    assert all(n.image == CUDA for n in result.nodes if n.gpus)


def test_a_lab_where_every_node_has_a_gpu_trains_with_nccl_over_the_lab_network():
    result = plan(nodes=2, gpus="all", gpus_per_node=2)
    for node in result.nodes:
        assert node.env == {"DDPLAB_BACKEND": "nccl", "NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1",
                            "NCCL_IB_DISABLE": "1"}
    auto = plan(nodes=2, gpus="all", gpus_per_node=2, nccl_transport="auto")
    assert [n.env for n in auto.nodes] == [{"DDPLAB_BACKEND": "nccl"}] * 2


def test_a_lab_that_mixes_gpu_and_cpu_nodes_trains_with_gloo_everywhere():
    result = plan(nodes=3, gpus="1")
    assert shape(result) == [("node0", (0,), CUDA), ("node1", (), CPU), ("node2", (), CPU)]
    assert [n.env["DDPLAB_BACKEND"] for n in result.nodes] == ["gloo"] * 3
    assert "NCCL_P2P_DISABLE" in result.nodes[0].env and "NCCL_P2P_DISABLE" not in result.nodes[1].env


@pytest.mark.parametrize("cuda, images", [
    ("all", [CUDA, CUDA, CUDA]), ("2", [CUDA, CUDA, CPU]), ("node2,node0", [CUDA, CPU, CUDA]),
])
def test_cuda_nodes_without_gpus_run_the_cuda_image_on_cpu(cuda, images):
    """No GPU anywhere: nothing is asked of the machine, and the trainer keeps its own backend (gloo on CPU)."""
    result = plan(None, nodes=3, cuda=cuda)
    assert [n.image for n in result.nodes] == images and result.gpu_nodes == [] and result.env == {}


def test_describe_says_each_nodes_gpus_and_image():
    assert plan(nodes=3, gpus="0,2", cuda="all").describe() == [
        f"node0: GPU 0, image {CUDA}", f"node1: GPU 2, image {CUDA}", f"node2: no GPU, image {CUDA}"]


@pytest.mark.parametrize("flags, key, fragment, hint", [
    ({"nodes": 3, "gpus": "3", "gpus_per_node": 2}, "--gpus-per-node=2", "3 GPUs (0,1,2) do not split evenly",
     "multiple of 2"),
    ({"nodes": 2, "gpus": "all"}, "--gpus='all'", "4 GPUs (0,1,2,3) at 1 a node need 4 GPU nodes, and the lab has 2",
     "--nodes 4 gives every GPU a node, or --gpus-per-node 2"),
    ({"nodes": 2, "gpus": "0,1,2"}, "--gpus='0,1,2'", "need 3 GPU nodes, and the lab has 2", "--nodes 3"),
    ({"nodes": 3, "gpus": "2", "cuda": "1"}, "--cuda='1'", "leaves out node1, which gets a GPU", "--cuda 2"),
    ({"nodes": 3, "gpus": "2", "cuda": "node0,node2"}, "--cuda='node0,node2'", "leaves out node1", "leave --cuda out"),
    ({"nodes": 3, "cuda": "4"}, "--cuda='4'", "asks for 4 CUDA nodes, and the lab has 3", "--nodes 4"),
    ({"nodes": 3, "cuda": "node3"}, "--cuda='node3'", "names node3, and the lab has node0..node2", "--nodes"),
])
def test_settings_that_do_not_fit_together_are_exit_2(flags, key, fragment, hint):
    with pytest.raises(ConfigError) as caught:
        plan(**flags)
    message = str(caught.value)
    assert caught.value.exit_code == 2 and key in message and fragment in message and hint in message, message


@pytest.mark.parametrize("machine, flags, fragment", [
    ([], {"gpus": "1"}, "--gpus 1 asks for GPUs, and nvidia-smi lists none"),
    (MACHINE[:2], {"gpus": "3"}, "--gpus 3 asks for 3 GPUs, and this machine has 2 (0: NVIDIA H100 80GB HBM3; 1: "),
    (MACHINE[:2], {"gpus": "1,2"}, "--gpus 1,2 names GPU 2, and this machine has 2 (0: NVIDIA"),
])
def test_gpus_the_machine_does_not_have_are_exit_1_and_listed(machine, flags, fragment):
    with pytest.raises(StateError) as caught:
        plan(machine, nodes=3, **flags)
    assert caught.value.exit_code == 1 and fragment in str(caught.value), caught.value


def test_a_setting_from_the_environment_is_named_as_its_key():
    settings = resolve_config(environ={"DDPLAB_GPUS": "3"}, dotenv={}, flags={"nodes": "3"})
    with pytest.raises(StateError, match=r"DDPLAB_GPUS=3 \(from environment\) asks for 3 GPUs"):
        build_gpu_plan(settings, MACHINE[:1])


# ------------------------------------------------------------------------------ the machine


def fake_run(stdout="", returncode=0, stderr=""):
    return lambda argv, **kw: subprocess.CompletedProcess(argv, returncode, stdout, stderr)


def test_detect_gpus_reads_nvidia_smi():
    gpus = detect_gpus("--gpus 1", run=fake_run(SMI), which=lambda _: "/usr/bin/nvidia-smi")
    assert gpus[3] == Gpu(3, "NVIDIA H100 80GB HBM3", "GPU-5d0a3c1e-0000-0000-0000-000000000003") and len(gpus) == 4


@pytest.mark.parametrize("which, run, fragment", [
    (lambda _: None, fake_run(), "no nvidia-smi on PATH"),
    (lambda _: "/usr/bin/nvidia-smi", fake_run("No devices were found\n", 6), "lists none on this machine (No devices"),
    (lambda _: "/usr/bin/nvidia-smi", fake_run("", 0), "lists none"),
])
def test_a_machine_without_gpus_is_one_clear_error(which, run, fragment):
    with pytest.raises(StateError) as caught:
        detect_gpus("--gpus 1", run=run, which=which)
    assert caught.value.exit_code == 1 and fragment in str(caught.value) and "--cuda N" in str(caught.value)


def engine(runtimes=("runc",), endpoint="unix:///var/run/docker.sock") -> Engine:
    return Engine(kind="docker", product="Docker Engine", version="27", endpoint=endpoint, context=None, os="Debian",
                  arch="x86_64", cpus=8, engine_id="x", runtimes=tuple(runtimes))


def test_the_engine_names_its_runtimes():
    found = classify({"Runtimes": {"runc": {}, "nvidia": {"path": "nvidia-container-runtime"}}}, {}, "unix:///x")
    assert found.runtimes == ("nvidia", "runc")


def test_the_nvidia_runtime_or_a_local_hook_lets_gpus_through():
    assert gpu_runtime_refusal(engine(("nvidia", "runc")), "--gpus 1", []) is None
    assert gpu_runtime_refusal(engine(), "--gpus 1", ["nvidia-container-runtime-hook"]) is None
    remote = gpu_runtime_refusal(engine(endpoint="ssh://gpu-box"), "--gpus 1", ["nvidia-container-cli"])
    assert remote and "not on this machine" in str(remote)
    refused = gpu_runtime_refusal(engine(("io.containerd.runc.v2", "runc")), "--gpus 1", [])
    assert refused.exit_code == 1 and "runtimes are io.containerd.runc.v2, runc (no nvidia)" in str(refused)
    assert "nvidia-ctk runtime configure" in str(refused)


def test_bad_settings_are_refused_before_the_machine_is_asked(monkeypatch):
    asked = []
    monkeypatch.setattr(gpus_mod, "detect_gpus", lambda what: asked.append(what) or MACHINE)
    with pytest.raises(ConfigError, match="need 3 GPU nodes"):
        up_mod.plan_gpus(config(nodes=2, gpus="3"), engine(("nvidia",)))
    assert not asked
    assert up_mod.plan_gpus(config(nodes=3, cuda="2"), engine()).cuda_nodes == ["node0", "node1"] and not asked
    with pytest.raises(StateError, match="NVIDIA Container Toolkit"):
        up_mod.plan_gpus(config(nodes=2, gpus="2"), engine())
    assert asked == ["--gpus 2"]
    assert up_mod.plan_gpus(config(nodes=4, gpus="all"), engine(("nvidia",))).gpu_nodes == ["node0", "node1", "node2", "node3"]


def container(node: str, rank: int, image: str, gpus: str | None = None) -> dict:
    labels = {"io.ddplab.node": node, "io.ddplab.node-rank": str(rank), **({"io.ddplab.gpus": gpus} if gpus else {})}
    return {"Labels": labels, "Image": image}


def test_a_running_lab_keeps_its_gpus_and_cuda_nodes_unless_told_otherwise():
    running = [container("node2", 2, CUDA), container("node0", 0, CUDA, "2,3"), container("node1", 1, CUDA, "0,1")]
    kept = up_mod.kept_gpus(config(nodes=3), running)
    assert (kept.gpus, kept.gpus_per_node, kept.cuda) == ("2,3,0,1", 2, "node0,node1,node2")
    one = up_mod.kept_gpus(config(), [container("node0", 0, CUDA, "1")])
    assert (one.gpus, one.gpus_per_node) == ("1,", 1)
    told = up_mod.kept_gpus(config(gpus="1"), running)
    assert (told.gpus, told.cuda) == ("1", "auto")
    cpu_only = up_mod.kept_gpus(config(), [container("node0", 0, CPU)])
    assert (cpu_only.gpus, cpu_only.cuda) == (None, "auto")


# -------------------------------------------------------------------------- compose, env files

FORMS = {
    "all": {"nodes": 4, "gpus": "all"},
    "count": {"nodes": 2, "gpus": "2"},
    "list": {"nodes": 2, "gpus": "3,1"},
    "per-node-2": {"nodes": 2, "gpus": "all", "gpus_per_node": 2},
    "mixed": {"nodes": 3, "gpus": "1"},
    "cuda-all-no-gpus": {"nodes": 3, "cuda": "all"},
    "cuda-2-mixed": {"nodes": 3, "cuda": "2"},
}


def compose_for(flags) -> dict:
    settings = config(**flags)
    compose_plan = ComposePlan(subnet="172.28.5.0/24", workspace=Path("/work/space"), user="1000:1000",
                               gpus=build_gpu_plan(settings, MACHINE if settings.gpus else None))
    return build_compose(settings, compose_plan, load_template())


@pytest.mark.parametrize("form", FORMS)
def test_compose_golden_for_every_form(form):
    check_golden(f"compose-gpus-{form}.yaml", render_compose(compose_for(FORMS[form])))


def test_only_gpu_nodes_reserve_devices_and_none_is_privileged():
    services = compose_for(FORMS["mixed"])["services"]
    gpu_node = services["node0"]
    assert gpu_node["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "device_ids": ["0"], "capabilities": ["gpu"]}]
    assert gpu_node["shm_size"] == "1g" and gpu_node["ulimits"] == {"memlock": -1, "stack": 67108864}
    assert gpu_node["labels"]["io.ddplab.gpus"] == "0"
    no_gpus = [services["node1"], services["node2"], *compose_for(FORMS["cuda-all-no-gpus"])["services"].values()]
    for node in no_gpus:
        assert not {"deploy", "shm_size", "ulimits"} & set(node) and "io.ddplab.gpus" not in node["labels"]
    for node in [gpu_node, *no_gpus]:
        assert not {"privileged", "ipc", "cap_add", "network_mode"} & set(node)
        assert node["security_opt"] == ["no-new-privileges"]
    assert "x-gpu" not in yaml.safe_load(render_compose(compose_for(FORMS["all"])))


def test_env_files_golden_for_a_mixed_and_an_all_gpu_lab():
    for form, wanted in (("mixed", ("node0", "node2")), ("per-node-2", ("node0",))):
        settings = config(**FORMS[form])
        ips = [node_ip("172.28.5.0/24", i) for i in range(settings.nodes)]
        files = build_env_files(topology_for_lab(settings, ips), settings.node_names,
                                build_gpu_plan(settings, MACHINE).env)
        for name in wanted:
            check_golden(f"gpus-{form}-{name}.env", files[f"{name}.env"])


def test_status_shows_a_gpu_column_only_in_a_lab_with_gpus():
    from rich.console import Console

    from labctl.cli.render import nodes_table, status_json
    from labctl.lab.lifecycle import NodeState

    def text(nodes) -> str:
        console = Console(width=120, record=True)
        console.print(nodes_table("demo", nodes))
        return console.export_text()

    cpu = [NodeState("node0", "10.9.0.10", "2.13.0", "running", 0)]
    gpu = [NodeState("node0", "10.9.0.10", "2.13.0", "running", 0, "0,1"), NodeState("node1", "-", "?", "exited", 1)]
    assert "GPU" not in text(cpu) and "gpus" not in status_json("demo", cpu)["nodes"][0]
    assert "GPU" in text(gpu) and "0,1" in text(gpu)
    assert [row.get("gpus") for row in status_json("demo", gpu)["nodes"]] == [[0, 1], None]


def test_with_image_puts_one_node_on_another_image_and_keeps_the_rest():
    # The version-mismatch scenario's last node runs another torch; the retry of a subnet race
    # renders the document again from this plan, so the image must live in the plan.
    settings = config(nodes=3)
    plan = build_gpu_plan(settings, None).with_image("node2", "ddplab-node:other")
    services = build_compose(settings, ComposePlan(subnet="172.28.5.0/24", workspace=Path("/w"), user="1000:1000",
                                                   gpus=plan), load_template())["services"]
    assert [services[n]["image"] for n in ("node0", "node1", "node2")] == [settings.image_tag] * 2 + ["ddplab-node:other"]
    assert plan.env == {} and "deploy" not in services["node2"]
