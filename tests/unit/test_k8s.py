"""`labctl k8s`'s pure parts: every manifest `k8s export` writes against the TrainJob and JobSet
schemas (and golden files, UPDATE_GOLDEN=1 to accept a change), the schemas against the APIs' facts,
a manifest read back as the lab runs it (PET_* as Kubeflow's torch plugin sets them, $(VAR)
expansion, the pods' names as the nodes' addresses), and each bad manifest refused with exit 2,
naming the field and the file, before anything is started."""

from __future__ import annotations

import itertools

import pytest
import yaml
from click.testing import CliRunner
from test_render import check_golden

from labctl.cli import main
from labctl.k8s.export import ExportJob, build_manifest, default_name, manifest_name, render_manifest
from labctl.k8s.manifest import INDEX, ManifestError, image_torch, load_manifest, quantity
from labctl.k8s.pods import describe_job, expand, pod_argv, pod_env, read_job, warm
from labctl.k8s.schema import schema_errors
from labctl.run.launch import TORCHRUN_MODULE, Launch, warm_argv

JOB = ExportJob(name="demo-trainer", args=("-m", "trainer", "--epochs", "1"), image="ddplab-node:torch2.13.0-cpu",
                nodes=3, env={"ATEN_CPU_CAPABILITY": "avx2"}, memory="4Gi", torch_version="2.13.0", lab="demo",
                lab_image="ddplab-node:torch2.13.0-cpu", workspace="/work/project")
ADDRESSES = ["172.28.5.10", "172.28.5.11", "172.28.5.12"]
VARIANTS = [JOB, ExportJob(name="big", args=("train.py", "--lr", "0.1"), image="registry.example.com/me/train:1",
                           nodes=8, nproc_per_node=4, env={"NCCL_DEBUG": "INFO"}, cpus=2.5, memory="16Gi", gpus=4,
                           torch_version="2.13.0", lab="gpu", lab_image="ddplab-node:torch2.13.0-cuda"),
            ExportJob(name="one", args=("-m", "trainer"), image="x:1", nodes=1)]


@pytest.mark.parametrize("kind, job", list(itertools.product(["trainjob", "jobset"], VARIANTS)))
def test_every_exported_manifest_passes_its_schema(kind, job):
    doc = yaml.safe_load(render_manifest(kind, job, "job.yaml"))
    assert schema_errors(doc, doc["kind"]) == []
    assert doc == build_manifest(kind, job)  # the comments hide nothing: the text is the data


@pytest.mark.parametrize("kind", ["trainjob", "jobset"])
def test_exported_manifests_golden(kind):
    check_golden(f"k8s-{kind}.yaml", render_manifest(kind, JOB, "job.yaml"))


def test_the_trainjob_says_what_labctl_run_runs():
    trainer = build_manifest("trainjob", JOB)["spec"]["trainer"]
    assert trainer["numNodes"] == 3 and trainer["numProcPerNode"] == 1
    assert trainer["command"] == ["torchrun"] and trainer["args"] == ["-m", "trainer", "--epochs", "1"]
    assert trainer["resourcesPerNode"] == {"limits": {"memory": "4Gi"}}
    gpu = build_manifest("trainjob", VARIANTS[1])["spec"]["trainer"]["resourcesPerNode"]["limits"]
    assert gpu == {"cpu": "2500m", "memory": "16Gi", "nvidia.com/gpu": 4}


def test_the_jobset_names_its_first_pod_and_takes_the_rank_from_the_completion_index():
    spec = build_manifest("jobset", JOB)["spec"]
    pods = spec["replicatedJobs"][0]["template"]["spec"]
    assert (pods["parallelism"], pods["completions"], pods["completionMode"]) == (3, 3, "Indexed")
    container = pods["template"]["spec"]["containers"][0]
    env = {var["name"]: var.get("value", var.get("valueFrom")) for var in container["env"]}
    assert env["MASTER_ADDR"] == "demo-trainer-node-0-0.demo-trainer"
    index = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    assert env["NODE_RANK"] == {"fieldRef": {"fieldPath": index}}
    assert container["args"][:3] == ["--nnodes=3", "--nproc-per-node=1", "--node-rank=$(NODE_RANK)"]


def test_the_comments_say_how_to_push_and_apply_and_what_the_lab_has_that_a_cluster_lacks():
    text = render_manifest("trainjob", JOB, "job.yaml")
    assert "docker tag ddplab-node:torch2.13.0-cpu REGISTRY/NAME:TAG\n#        docker push REGISTRY/NAME:TAG" in text
    assert "kubectl apply -f job.yaml" in text and "labctl k8s run job.yaml" in text
    assert "shaped links" in text and "/work/project" in text and "numProcPerNode, an integer since Trainer 2.2" in text
    pushed = render_manifest("jobset", VARIANTS[1], "-")
    assert "docker push registry.example.com/me/train:1" in pushed and "kubectl apply -f FILE" in pushed


@pytest.mark.parametrize("text, name", [("demo-trainer", "demo-trainer"), ("My_Lab.Train", "my-lab-train"),
                                        ("3d-model", "ddplab-3d-model"), ("x" * 80, "x" * 40)])
def test_manifest_names_are_dns_labels(text, name):
    assert manifest_name(text) == name


def test_default_names_come_from_the_lab_and_the_script():
    assert default_name("demo", ["-m", "trainer", "--epochs", "1"]) == "demo-trainer"
    assert default_name("ddplab", ["examples/my_ddp.py"]) == "ddplab-my-ddp"


# --- the schemas hold the APIs' facts ---------------------------------------------------------------

def trainjob(**trainer) -> dict:
    doc = build_manifest("trainjob", JOB)
    doc["spec"]["trainer"].update(trainer)
    return doc


@pytest.mark.parametrize("doc, field, fragment", [
    (trainjob(numNodes="three"), "spec.trainer.numNodes", "is not of type 'integer'"),
    (trainjob(numNodes=0), "spec.trainer.numNodes", "less than the minimum"),
    (trainjob(numProcPerNode="auto"), "spec.trainer.numProcPerNode", "not of type 'integer'"),  # int since 2.2
    (trainjob(numnodes=3), "spec.trainer.numnodes", "unexpected"),
    (trainjob(command="torchrun"), "spec.trainer.command", "not of type 'array'"),
    (trainjob(env=[{"value": "1"}]), "spec.trainer.env[0].name", "required"),
    (trainjob(resourcesPerNode={"limits": {"cpu": "two"}}), "spec.trainer.resourcesPerNode.limits.cpu", "match"),
    ({**trainjob(), "spec": {"trainer": {}}}, "spec.runtimeRef", "required"),
    ({**trainjob(), "metadata": {"name": "3-jobs"}}, "metadata.name", "match"),
    ({**trainjob(), "spec": {**trainjob()["spec"], "podTemplateOverrides": []}}, "spec.podTemplateOverrides",
     "unexpected"),  # Trainer 2.2 replaced it with runtimePatches
])
def test_the_trainjob_schema_refuses_what_the_api_refuses(doc, field, fragment):
    errors = schema_errors(doc, "TrainJob")
    assert errors and errors[0][0] == field and fragment in errors[0][1], errors


def test_the_jobset_schema_requires_a_named_replicated_job_with_a_template():
    doc = build_manifest("jobset", JOB)
    del doc["spec"]["replicatedJobs"][0]["template"]
    assert schema_errors(doc, "JobSet")[0][0] == "spec.replicatedJobs[0].template"
    doc = build_manifest("jobset", JOB)
    doc["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0].pop("name")
    assert schema_errors(doc, "JobSet")[0][0].endswith("containers[0].name")


# --- read back as the lab runs it ------------------------------------------------------------------

def read(doc: dict):
    return read_job(load_manifest(yaml.safe_dump(doc), "job.yaml"), "job.yaml", 29500)


def test_an_exported_trainjob_reads_back_as_the_job_it_was():
    job = read(build_manifest("trainjob", JOB))
    assert (job.kind, job.nodes, job.nproc_per_node, job.command, job.args) == \
        ("TrainJob", 3, "1", ("torchrun",), ("-m", "trainer", "--epochs", "1"))
    env = pod_env(job, 2, ADDRESSES)
    assert env == {"PET_NNODES": "3", "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": "2",
                   "PET_MASTER_ADDR": "172.28.5.10", "PET_MASTER_PORT": "29500", "ATEN_CPU_CAPABILITY": "avx2"}
    assert job.image_torch == "2.13.0" and job.memory_bytes == 4 * 2**30 and job.cpus is None


def test_an_exported_jobset_reads_back_with_each_pods_rank_and_the_first_pods_address():
    job = read(build_manifest("jobset", JOB))
    assert job.pod_names[0] == "demo-trainer-node-0-0.demo-trainer" and job.env[2] == ("NODE_RANK", INDEX)
    env = pod_env(job, 1, ADDRESSES)
    assert env["MASTER_ADDR"] == "172.28.5.10" and env["NODE_RANK"] == "1"
    assert pod_argv(job, env, ADDRESSES)[:6] == ["torchrun", "--nnodes=3", "--nproc-per-node=1", "--node-rank=1",
                                                 "--master-addr=172.28.5.10", "--master-port=29500"]


@pytest.mark.parametrize("trainer, nproc", [({}, "1"), ({"resourcesPerNode": {"requests": {"cpu": "500m"}}}, "1"),
                                            ({"resourcesPerNode": {"limits": {"cpu": 3}}}, "3"),
                                            ({"resourcesPerNode": {"requests": {"cpu": "2"}, "limits": {"cpu": 4}}}, "2"),
                                            ({"resourcesPerNode": {"limits": {"nvidia.com/gpu": 2}}}, "auto"),
                                            ({"numProcPerNode": 4, "resourcesPerNode": {"limits": {"cpu": 1}}}, "4")])
def test_processes_per_node_as_kubeflows_torch_plugin_counts_them(trainer, nproc):
    doc = trainjob(**trainer)
    for field in ("numProcPerNode", "resourcesPerNode"):  # the export's own, where the case gives none
        if field not in trainer:
            del doc["spec"]["trainer"][field]
    assert read(doc).nproc_per_node == nproc


def test_kubernetes_expansion_and_pod_names():
    assert expand("$(A)-$(B)-$$(A)", {"A": "1"}) == "1-$(B)-$(A)"
    doc = build_manifest("jobset", JOB)
    container = doc["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    container["env"].append({"name": "PEER", "value": "demo-trainer-node-0-2.demo-trainer.default.svc.cluster.local:80"})
    container["env"].append({"name": "BOTH", "value": "$(MASTER_ADDR)/$(PEER)"})
    env = pod_env(read(doc), 0, ADDRESSES)
    assert env["PEER"] == "172.28.5.12:80" and env["BOTH"] == "172.28.5.10/172.28.5.12:80"


@pytest.mark.parametrize("argv, forked", [
    (["python", "train.py", "--steps", "5"], ["train.py", "--steps", "5"]),
    (["python3", "-m", "trainer", "--epochs", "1"], ["-m", "trainer", "--epochs", "1"]),
    (["torchrun", "--nnodes=2", "train.py"], ["-m", TORCHRUN_MODULE, "--nnodes=2", "train.py"]),
    (["python", "-u", "train.py"], None),  # a python option first: as written
    (["python", "-m"], None),
    (["/usr/bin/python3", "train.py"], None),  # another python than the lab's
    (["bash", "-c", "python train.py"], None),
    (["python"], None),
])
def test_python_and_torchrun_pods_are_forked_by_the_nodes_fork_server(argv, forked):
    out = warm(argv)
    if forked is None:
        assert out == argv
    else:
        assert out == warm_argv(forked)
        assert Launch("node0", "node0", ["env", *out]).torchrun == (argv[0] == "torchrun")


def test_what_the_lab_cannot_honour_is_listed_not_dropped():
    doc = trainjob(env=[{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
                   command=["python", "train.py"])
    doc["spec"]["runtimePatches"] = [{"manager": "me", "trainingRuntimeSpec": {}}]
    doc["spec"]["suspend"] = True
    lines = describe_job(read(doc))
    assert any("not torchrun" in line for line in lines)
    assert any(line.startswith("not honoured: spec.runtimePatches") for line in lines)
    assert any("TOKEN: valueFrom secretKeyRef" in line for line in lines)
    assert any("spec.suspend" in line for line in lines)


def test_a_jobsets_volumes_and_node_selector_are_listed_as_not_honoured():
    doc = build_manifest("jobset", JOB)
    pod = doc["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod.update(volumes=[{"name": "data", "emptyDir": {}}], nodeSelector={"gpu": "h100"})
    lines = describe_job(read(doc))
    assert any(line.endswith("template.spec.volumes") for line in lines)
    assert any(line.endswith("template.spec.nodeSelector") for line in lines)


@pytest.mark.parametrize("image, annotations, torch", [
    ("pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime", {}, "2.7.1"), ("ddplab-node:torch2.13.0-cpu", {}, "2.13.0"),
    ("registry.example.com/me/train:v3", {}, ""),
    ("registry.example.com/me/train:v3", {"ddplab.io/torch-version": "2.13.0"}, "2.13.0")])
def test_the_torch_a_manifest_says_its_image_has(image, annotations, torch):
    assert image_torch(image, annotations) == torch


@pytest.mark.parametrize("text, value", [("2", 2), (2, 2), ("500m", 0.5), ("4Gi", 4 * 2**30), ("1e3", 1000),
                                         ("128974848", 128974848), ("129M", 129e6)])
def test_quantities(text, value):
    assert quantity(text) == value


# --- bad manifests: exit 2, the field and the file named, nothing started --------------------------

@pytest.fixture
def isolated(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")  # nothing could start
    return tmp_path


def no_command() -> dict:
    doc = trainjob()
    del doc["spec"]["trainer"]["command"]
    return doc


@pytest.mark.parametrize("text, field, fragment", [
    ("kind: TrainJob\nspec: [unclosed", "line 2", "not YAML"),
    (yaml.safe_dump({**trainjob(), "kind": "PyTorchJob"}), "kind", "'PyTorchJob' is not a kind the lab runs"),
    (yaml.safe_dump(trainjob(numNodes="three")), "spec.trainer.numNodes", "'three' is not of type 'integer'"),
    (yaml.safe_dump(no_command()), "spec.trainer.command", "is missing"),
    (yaml.safe_dump(trainjob(env=[{"name": "PET_NNODES", "value": "2"}])), "spec.trainer.env", "PET_NNODES"),
    (yaml.safe_dump({**trainjob(), "spec": {**trainjob()["spec"], "runtimeRef": {"name": "mpi-distributed"}}}),
     "spec.runtimeRef.name", "torch runtime"),
    ("- just\n- a list\n", "(the document)", "one YAML mapping"),
])
def test_bad_manifests_exit_2_naming_the_field_and_the_file(isolated, text, field, fragment):
    (isolated / "job.yaml").write_text(text)
    result = CliRunner().invoke(main, ["k8s", "run", "job.yaml"])
    assert result.exit_code == 2, result.output
    assert f"job.yaml: {field}" in result.output and fragment in result.output and "Traceback" not in result.output


def test_a_missing_file_and_a_bad_kind_option_exit_2(isolated):
    result = CliRunner().invoke(main, ["k8s", "run", "nope.yaml"])
    assert result.exit_code == 2 and "nope.yaml" in result.output and "cannot be read" in result.output
    result = CliRunner().invoke(main, ["k8s", "export", "--kind", "pytorchjob", "--", "-m", "trainer"])
    assert result.exit_code == 2 and "pytorchjob" in result.output


def test_export_needs_no_engine_and_writes_a_valid_manifest(isolated):
    result = CliRunner().invoke(main, ["k8s", "export", "--lab", "demo", "-N", "3", "-e", "LR=0.1", "--", "-m", "trainer"])
    assert result.exit_code == 0, result.output
    doc = yaml.safe_load((isolated / "trainjob.yaml").read_text())
    assert schema_errors(doc, "TrainJob") == [] and doc["spec"]["trainer"]["numNodes"] == 3
    assert {"name": "LR", "value": "0.1"} in doc["spec"]["trainer"]["env"]
    result = CliRunner().invoke(main, ["k8s", "export", "--name", "Bad_Name", "--", "-m", "trainer"])
    assert result.exit_code == 2 and "--name" in result.output and "bad-name" in result.output


def test_manifest_errors_carry_the_field():
    with pytest.raises(ManifestError) as caught:
        load_manifest(yaml.safe_dump(trainjob(numNodes="three")), "f.yaml")
    assert caught.value.field == "spec.trainer.numNodes"
