"""labctl.api without an engine: settings resolve as for the CLI, plans are data, results answer
for the run, and a failed `up` inside `with Lab(...)` still tears down."""

import subprocess
import sys
from pathlib import Path

import pytest

from labctl.api import Lab, Workspace, lab_spec
from labctl.diagnose.findings import Diagnosis, Finding, PreflightFailed
from labctl.errors import ConfigError, LabError, RunFailed, StateError
from labctl.run.launch import Elastic, Launch
from labctl.run.plan import LaunchOptions, RunOptions, build_run_plan
from labctl.run.result import Outcome, RunResult
from labctl.spec.labspec import check_nproc, check_timeout

ENVS = {f"node{i}": {"MASTER_ADDR": "172.28.5.10", "MASTER_PORT": "29500", "NPROC_PER_NODE": "1"} for i in range(3)}


def offline(**settings) -> Lab:
    """A Lab whose engine is never there: anything that asks for it gets the StateError labctl gives."""
    def no_engine():
        raise StateError("no Docker engine answers at unix:///nonexistent (test)", hint="start one")

    return Lab(workspace=settings.pop("workspace"), environ={}, connect=no_engine, **settings)


def test_settings_resolve_like_the_cli(tmp_path):
    (tmp_path / ".env").write_text("DDPLAB_NODES=5\nDDPLAB_MEMORY=2g\n")
    lab = Lab("demo", nodes=4, cpus=0.5, workspace=tmp_path, environ={"DDPLAB_MEMORY": "1g"})
    assert (lab.name, lab.config.nodes, lab.config.cpus, lab.config.memory) == ("demo", 4, 0.5, "1g")
    assert lab.directory == tmp_path.resolve() / ".lab" / "demo"


def test_one_spec_for_lab_and_up(tmp_path):
    # what `labctl up` takes besides the settings it always had: links, per-node CPUs, SSH, CPU kernels
    lab = Lab("demo", nodes=4, bw="1000mbit", node_cpus={"node3": 0.25}, ssh=True, gpus=[1], workspace=tmp_path,
              environ={"DDPLAB_CPU_KERNELS": "native"})
    spec = lab.config
    assert (spec.bw, spec.node_cpus, spec.ssh, spec.gpus, spec.cpu_kernels) == ("1gbit", (("node3", 0.25),), True,
                                                                              "1,", "native")
    assert spec == lab_spec("demo", nodes="4", bw="1gbit", node_cpus="node3=0.25", ssh="yes", gpus="1,",
                            workspace=tmp_path, environ={"DDPLAB_CPU_KERNELS": "native"})
    assert Lab(spec=spec, workspace=tmp_path).config is spec
    with pytest.raises(LabError, match="no setting 'node'"):
        Lab(node=3, workspace=tmp_path, environ={})
    with pytest.raises(LabError, match="either a spec or settings"):
        Lab(spec=spec, nodes=3, workspace=tmp_path)


def test_bad_settings_are_the_projects_errors(tmp_path):
    with pytest.raises(ConfigError, match="invalid --nodes='0'"):
        Lab(nodes=0, workspace=tmp_path, environ={})
    with pytest.raises(ConfigError, match="--timeout-s"):
        check_timeout(0)
    with pytest.raises(ConfigError, match="--nproc-per-node"):
        check_nproc(0)
    assert check_nproc("2") == 2 and check_nproc(None) is None


def test_no_engine_is_asked_until_one_is_needed(tmp_path):
    lab = offline(workspace=tmp_path)
    with pytest.raises(LabError, match="no run yet"):  # saved logs: no engine needed, and none asked
        lab.logs()
    with pytest.raises(StateError, match="no Docker engine answers"):
        lab.status()


def test_a_failed_up_in_a_with_block_raises_its_own_error(tmp_path):
    entered = []
    with pytest.raises(StateError, match="no Docker engine answers"):
        with offline(workspace=tmp_path) as lab:
            entered.append(lab)
    assert not entered


def test_a_bad_shape_is_refused_before_the_engine(tmp_path):
    with pytest.raises(ConfigError, match="bw='100mbps'.*BYTES per second"):  # with the lab's spec, before up
        offline(workspace=tmp_path, bw="100mbps")


def test_a_run_plan_is_data(tmp_path):
    plan = build_run_plan(ENVS, ["-m", "trainer"], tmp_path,
                          LaunchOptions(nproc_per_node=2, elastic=Elastic(1, 2, 3), pg_timeout_s=10), cpus=6)
    assert plan.nodes == ["node0", "node1", "node2"] and plan.store and plan.min_nodes == 2
    assert plan.run_dir == tmp_path / "runs" / plan.run_id and not plan.run_dir.exists()
    assert [launch.node for launch in plan.launches] == plan.nodes
    env = plan.launches[0].env
    assert env["PET_RDZV_ID"] == plan.run_id and env["OMP_NUM_THREADS"] == "1" and env["PET_MAX_RESTARTS"] == "1"
    lines = plan.describe(lambda node: f"lab-{node}")
    assert lines[1].startswith("node1 (lab-node1): DDPLAB_RUN_ID=") and "-m torch.distributed.run --nproc-per-node 2 --no-python python -c <labctl/remote/forkserver.py> request" in lines[1]
    assert lines[1].endswith("<labctl/remote/worker.py> -- -m trainer")


def test_real_hosts_write_their_outputs_on_the_host(tmp_path):
    plan = build_run_plan(ENVS, ["train.py"], tmp_path, LaunchOptions(launcher="static"),
                          remote_runs_parent=".lab/cluster")
    assert plan.remote_run_dir == f".lab/cluster/runs/{plan.run_id}" and not plan.store
    assert {launch.env["DDPLAB_RUN_DIR"] for launch in plan.launches} == {plan.remote_run_dir}
    assert [launch.env["RANK"] for launch in plan.launches] == ["0", "1", "2"]


def test_a_run_takes_one_options_value_or_its_fields(tmp_path):
    given = RunOptions.given(RunOptions(timeout_s=60), {"check": False}, "Lab.run", "lab")
    assert given == RunOptions(timeout_s=60, check=False)
    assert RunOptions(nproc_per_node="2", max_restarts=1, nnodes="2:3").launch(3) == LaunchOptions(
        nproc_per_node=2, elastic=Elastic(1, 2, 3), pg_timeout_s=30.0)
    with pytest.raises(ConfigError, match="MAX must be the lab's node count, 3"):
        RunOptions(nnodes="2:4").launch(3)
    with pytest.raises(LabError, match="sync: real hosts' option, not a lab run's"):
        RunOptions(sync=False).only_for("lab")
    with pytest.raises(LabError, match="nnodes, ifname: the lab's nodes' options, not a hosts run's"):
        RunOptions(nnodes="1:2", ifname="eth0").only_for("hosts")
    lab = offline(workspace=tmp_path)
    with pytest.raises(LabError, match="Lab.run has no option timeout") as unknown:  # before any engine is asked
        lab.run("train.py", timeout=5)
    assert "timeout_s" in unknown.value.hint
    with pytest.raises(ConfigError, match="--nproc-per-node"):  # bad input, told before the lab's state
        lab.run("train.py", nproc_per_node=0)
    with pytest.warns(DeprecationWarning, match="Lab.run_plan is now Lab.plan_run"), pytest.raises(LabError):
        lab.run_plan("train.py", excludes=("*.ckpt",))


def test_a_workspace_works_without_a_lab(tmp_path):
    """`labctl build`, `env`, `ls`, `gc`, `bench up|start` and `scenario run` go through one object;
    the engine is asked for only when a call needs it."""
    (tmp_path / ".env").write_text("DDPLAB_NODES=5\n")

    def no_engine():
        raise StateError("no Docker engine answers at unix:///nonexistent (test)", hint="start one")

    here = Workspace(tmp_path, environ={}, connect=no_engine)
    assert here.spec("x", bw="1gbit") == lab_spec("x", workspace=tmp_path, environ={}, bw="1gbit")
    assert here.spec().nodes == 5
    addresses, paths, commands = here.write_host_env("10.0.0.1,10.0.0.2", here.spec(iface="eth0"), "ddplab",
                                                     tmp_path / "hosts")
    assert addresses == ("10.0.0.1", "10.0.0.2") and [p.name for p in paths] == ["node0.env", "node1.env"]
    assert "MASTER_ADDR=10.0.0.1" in paths[1].read_text() and [c[1] for c in commands] == list(addresses)
    with pytest.raises(StateError, match="no Docker engine"):
        here.labs()


def test_a_command_on_a_lab_does_not_load_the_workspace_s_benches():
    code = "import sys, labctl.cli.run, labctl.api; print(sorted(m for m in sys.modules if 'bench' in m or 'scenarios' in m))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def result_of(*outcomes: Outcome, run_dir=Path("/runs/r1")) -> RunResult:
    failed = next((o for o in outcomes if o.exit_code), None)
    return RunResult(run_dir, list(outcomes), failed)


def test_a_result_answers_for_the_run():
    summary = '{"final_loss": 1.5, "replicas_consistent": true}'
    node0 = Outcome(Launch("node0", "node0", ["torchrun"]), 0, lines=["epoch 1", f"SUMMARY {summary}", "bye"])
    node1 = Outcome(Launch("node1/r1", "node1", ["python"]), 0, lines=["epoch 1"])
    result = result_of(node0, node1)
    assert result.ok and result.exit_codes == {"node0": 0, "node1/r1": 0}
    assert result.logs == {"node0": Path("/runs/r1/node0.log"), "node1": Path("/runs/r1/node1.log")}
    assert result.summary == {"final_loss": 1.5, "replicas_consistent": True}
    assert result_of(node1).summary is None


def test_run_failed_carries_the_result():
    bad = Outcome(Launch("node1", "node1", ["torchrun"]), 1, lines=["ValueError: boom"])
    result = result_of(Outcome(Launch("node0", "node0", ["torchrun"]), None, stopped=True), bad)
    error = RunFailed(result.explain(), result=result)
    assert not result.ok and error.result is result and str(error).startswith("node1 failed first: ValueError: boom")


def test_preflight_refuses_problems_and_passes_warnings():
    warn = Finding("cpus", "node2", False, "node2 is slower", warn=True)
    fine = Diagnosis("lab x: nodes", [Finding("env", "all", True, "ok"), warn], {}, 0.1)
    fine.raise_for_problems("labctl doctor --lab x")
    assert fine.ok and fine.problems == [warn]
    bad = Diagnosis("lab x: nodes", [warn, Finding("versions", "node1", False, "torch 2.14 here")], {}, 0.1)
    with pytest.raises(PreflightFailed, match="preflight found 1 problem; the run was not started") as caught:
        bad.raise_for_problems("labctl doctor --lab x")
    assert caught.value.diagnosis is bad and caught.value.hint.startswith("`labctl doctor --lab x`")
    assert bad.as_dict()["ok"] is False and len(bad.as_dict()["findings"]) == 2


def test_old_names_still_work_for_one_release_and_say_so():
    import labctl.api

    with pytest.warns(DeprecationWarning, match="LabSpec"):
        assert labctl.api.LabConfig is labctl.api.LabSpec
    with pytest.warns(DeprecationWarning, match="gc_labs"):
        assert labctl.api.gc is labctl.api.gc_labs
    with pytest.raises(AttributeError):
        labctl.api.no_such_name
