"""The benchmarks' orchestration without Docker: the real bench code drives a LabSession whose engine
is a recorder. Runs are answered with canned SUMMARY lines; shaping, link reads and CPU limits (the
engine-side primitives of labctl.net.apply and labctl.engine.docker) are recorded instead of applied."""

from __future__ import annotations

import json

import pytest

from labctl.bench import allreduce, cost, scaling_run, straggler
from labctl.engine import docker as lab_docker
from labctl.errors import ConfigError, LabError, RunFailed, StateError
from labctl.lab.lifecycle import NodeState
from labctl.net import apply as netshape
from labctl.net.tc import LinkState
from labctl.run.result import Outcome, RunResult
from labctl.session import LabSession
from labctl.spec.labspec import LabSpec


class FakeLab(LabSession):
    """A running lab of `nodes` nodes (or none up), no engine behind it. Every engine-side step goes to
    `events`; a run is answered by `answer(plan)`, a SUMMARY dict (or an exception it raises)."""

    cpus = 2

    def __init__(self, workspace, events: list, nodes: int = 3, up: bool = True, answer=None, **settings):
        super().__init__(LabSpec(lab="fake", **settings), workspace, client="fake-client",
                         connect=lambda: pytest.fail("the fake lab has a client; nothing should make another"))
        self.events = events
        self.nodes_up = nodes
        self.up = up
        self.answer = answer

    def running(self) -> list[NodeState]:
        self.events.append(("running",))
        if not self.up:
            raise StateError("lab fake is not up")
        return [NodeState(f"node{i}", f"10.9.0.{10 + i}", "2.13.0", "running", i) for i in range(self.nodes_up)]

    def overlay_spec(self):
        self.events.append(("overlay",))
        return None  # no mesh VPN (test_tunnelcost.py prices one)

    def node_env(self, names=None):
        names = names if names is not None else self.node_names()
        return {name: {"NODE_RANK": str(rank), "MASTER_ADDR": "10.9.0.10", "MASTER_PORT": "29500"}
                for rank, name in enumerate(names)}

    def execute(self, plan, *, echo=True, check=True) -> RunResult:
        argv = plan.launches[0].argv
        self.events.append(("run", tuple(plan.nodes), argv[argv.index("-m") + 1:]))
        lines = [f"node0 | SUMMARY {json.dumps(self.answer(plan))}"]
        return RunResult(plan.run_dir, [Outcome(plan.launches[0], 0, lines=lines)], None)


@pytest.fixture
def events():
    return []


@pytest.fixture
def engine(monkeypatch, events):
    """Links as `links` says (read back by read_links), shaping and CPU limits recorded in `events`."""
    state = {"links": {}, "cpus_before": None, "refuse_cpus": None}

    def read_links(client, lab, nodes, iface):
        events.append(("read_links", tuple(nodes)))
        return {n: LinkState("tbf", state["links"][n]) if n in state["links"] else LinkState("none") for n in nodes}

    def check_cpus(client, limits):
        events.append(("check_cpu_limits", limits))
        if state["refuse_cpus"]:
            raise state["refuse_cpus"]

    def node_cpus_limit(client, lab, node, cpus=None):
        return state["cpus_before"]

    monkeypatch.setattr(netshape, "read_links", read_links)
    monkeypatch.setattr(netshape, "apply_shape", lambda c, lab, nodes, shape, iface:
                        events.append(("shape", tuple(nodes), shape.rate_bps)))
    monkeypatch.setattr(netshape, "clear_shape", lambda c, lab, nodes, iface: events.append(("clear", tuple(nodes))))
    monkeypatch.setattr(lab_docker, "check_cpu_limits", check_cpus)
    monkeypatch.setattr(lab_docker, "node_cpus_limit", node_cpus_limit)
    monkeypatch.setattr(lab_docker, "apply_node_cpus", lambda c, lab, node, cpus:
                        events.append(("cpus", node, cpus)))
    return state


def summary(tokens: float = 1000.0, **extra) -> dict:
    return {"tokens_per_s": tokens, "step_ms": 20.0, "compute_ms_per_step": 12.0, "allreduce_ms_per_step": 5.0,
            "comm_fraction": 0.25, "params": 100_000, **extra}


def flag(args, name: str):
    return args[args.index(name) + 1] if name in args else None


# ------------------------------------------------------------------------------------------ cost


def test_cost_ranks_come_from_nodes_else_from_the_lab():
    assert cost.rank_count("8", 3) == 8  # the calculator is for the real cluster, not only this lab
    assert cost.rank_count(None, 6) == 6
    with pytest.raises(ConfigError, match="--nodes=None: is needed outside a running lab") as info:
        cost.rank_count(None, None)
    assert info.value.hint == "labctl cost --params 760e6 --nodes 2"
    for bad in ("two", "0", "1000001", "1.5"):
        with pytest.raises(ConfigError, match=f"--nodes='{bad}': must be a whole number of ranks from 1 to 1000000"):
            cost.rank_count(bad, 3)


def test_cost_reads_the_running_labs_world_and_slowest_link(tmp_path, events, engine):
    lab = FakeLab(tmp_path, events, nodes=2, nproc_per_node=2)
    assert cost.lab_link(lab) == (None, 4)
    engine["links"] = {"node0": 10**9, "node1": 10**8}
    assert cost.lab_link(lab) == (("100mbit", 10**8), 4)
    report = cost.estimate(cost.CostQuery(760e6, "bf16"), lab=lab)
    assert report.ranks == 4 and [r["link"] for r in report.rows][:2] == ["lab (100mbit)", "1GbE"]
    assert len(report.rows) == 1 + len(cost.PRESETS)
    given = cost.estimate(cost.CostQuery(760e6, "bf16", "2", ["10GbE"]), lab=lab)
    assert given.ranks == 2 and [r["link"] for r in given.rows] == ["10GbE"]
    assert events.count(("read_links", ("node0", "node1"))) == 4  # asked even when --nodes and --link say it all


def test_cost_outside_a_lab_needs_nodes(tmp_path, events, engine):
    down = FakeLab(tmp_path, events, up=False)
    assert cost.lab_link(down) == (None, None)
    with pytest.raises(ConfigError, match="is needed outside a running lab"):
        cost.estimate(cost.CostQuery(1e9), lab=down)
    report = cost.estimate(cost.CostQuery(1e9, "fp32", "4"), lab=down)
    assert report.ranks == 4 and [r["link"] for r in report.rows] == [p.name for p in cost.PRESETS.values()]
    assert ("read_links", ()) not in events and all(e == ("running",) for e in events)  # a lab not up: no overlay asked


# ------------------------------------------------------------------------------------- allreduce


def test_allreduce_measures_the_slowest_links_wire_then_sweeps(tmp_path, events, engine, monkeypatch):
    engine["links"] = {"node0": 10**8, "node1": 5 * 10**7, "node2": 10**8}
    wires = []
    monkeypatch.setattr(allreduce, "measure_wire", lambda client, lab, a, b, ip: wires.append((a, b, ip)) or 4.5e7)
    timings = [{"size": 1024, "count": 256, "time_us": 400.0, "probe": True},
               {"size": 1024, "count": 256, "time_us": 410.0}, {"size": 2048, "count": 512, "time_us": 700.0}]

    def answer(plan):
        plan.run_dir.mkdir(parents=True)
        (plan.run_dir / "allreduce.json").write_text(json.dumps(timings))
        return {}

    lab = FakeLab(tmp_path, events, answer=answer)
    messages = []
    result = allreduce.measure(lab, [1024, 2048], 3, 0.85, lambda m: messages.append(m) or events.append(m))
    assert wires == [("node1", "node0", "10.9.0.10")]  # gloo's all-reduce ring: rank r sends to r-1
    sweep = f"allreduce sweep on 3 nodes, 2 sizes x 3 iterations, up to 101 where they take under 0.5 s (logs: {result.run_dir})"
    assert messages == ["measuring the wire node1 -> node0 with iperf3 (3 s)", sweep]
    assert events.index(sweep) < next(i for i, e in enumerate(events) if e[0] == "run")  # the logs named first
    assert events[-1] == ("run", ("node0", "node1", "node2"),
                          ["trainer.bench_allreduce", "--sizes", "1024,2048", "--iters", "3",
                           "--probe-size", "1024", "--probe-iters", str(allreduce.PROBE_ITERS),
                           "--max-iters", "101", "--budget-s", "0.5", "--fill-ms", "30"])
    assert result.title == ("allreduce on gloo (cpu tensors), 3 nodes, link shaped 50mbit (slowest hop node1 -> node0), iperf3 wire 45 Mbit/s; "
                            "model: ring at 85% of the link, 50 us a hop; calibrated: the wire, a step 0 ms + max(stack 39 us, transfer)")
    written = json.loads((result.run_dir / "bench-allreduce.json").read_text())
    assert written == [r.as_dict() for r in result.rows] and [r["size"] for r in written] == [1024, 2048]


def test_allreduce_says_what_it_measured_and_passes_the_nccl_debug_env(tmp_path, events, engine, monkeypatch):
    from labctl.run.userenv import NCCL_DEBUG_ENV

    monkeypatch.setattr(allreduce, "measure_wire", lambda *args: 9e9)
    timings = [{"size": 4096, "count": 1024, "time_us": 50.0, "backend": "nccl", "device": "cuda"}]
    envs = []

    def answer(plan):
        envs.append(plan.launches[0].env)
        plan.run_dir.mkdir(parents=True)
        (plan.run_dir / "allreduce.json").write_text(json.dumps(timings))
        return {}

    result = allreduce.measure(FakeLab(tmp_path, events, nodes=2, answer=answer), [4096], 1, env=NCCL_DEBUG_ENV)
    assert result.title.startswith("allreduce on nccl (cuda tensors), 2 nodes")
    assert (result.rows[0].backend, result.rows[0].device) == ("nccl", "cuda")
    assert result.rows[0].as_dict()["backend"] == "nccl"
    assert envs[0]["NCCL_DEBUG"] == "INFO" and envs[0]["NCCL_DEBUG_SUBSYS"] == "INIT,NET"


def test_allreduce_refuses_a_single_node_before_touching_a_link(tmp_path, events, engine):
    with pytest.raises(LabError, match="lab fake has 1 node; an allreduce across nodes needs 2 or more") as info:
        allreduce.measure(FakeLab(tmp_path, events, nodes=1), [1024], 1)
    assert info.value.hint == "labctl up --lab fake --nodes 3" and events == [("running",)]


# --------------------------------------------------------------------------------------- scaling


def scaling_answer(plan):
    args = plan.launches[0].argv  # torchrun says the processes per node; the warm path's env does
    nproc = int(flag(args, "--nproc-per-node") or plan.launches[0].env["LOCAL_WORLD_SIZE"])
    return summary(1000.0 * len(plan.nodes) * nproc, corpus_sha256="a" * 64)


def test_scaling_shapes_each_rate_for_its_rows_and_clears_it(tmp_path, events, engine):
    lab = FakeLab(tmp_path, events, answer=scaling_answer)
    messages = []
    result = scaling_run.measure(lab, scaling_run.ScalingOptions(nodes_list="1,2", rates=("1gbit", "100mbit"), nproc=2,
                                                                steps=5, repeats=2, host=False),
                                 out_dir=tmp_path / "out", report=messages.append)
    every = ("node0", "node1", "node2")
    args = ["trainer", "--workload", "gpt", "--steps", "5", "--micro-batch", "8", "--threads", "1", "--backend", "gloo"]
    one_round = [("run", ("node0",), args), ("run", ("node0",), args), ("run", ("node0", "node1"), args),
                 ("shape", every, 10**9), ("run", ("node0", "node1"), args), ("clear", every),
                 ("shape", every, 10**8), ("run", ("node0", "node1"), args), ("clear", every)]
    assert events == [("running",), ("read_links", every)] + one_round * 2 + [("clear", every)]
    assert [r.name for r in result.rows] == ["node0 x 2 procs", "1 node", "2 nodes", "2 nodes @ 1gbit",
                                             "2 nodes @ 100mbit"]
    assert all(len(r.samples) == 2 for r in result.rows) and result.rows[0].tokens_per_s == 2000.0
    assert messages[0] == ("[1/10] node0 x 2 procs: 2,000 tokens/s, compute 12.0 ms, all-reduce 5.0 ms per step")
    assert messages[-2].startswith("[10/10] 2 nodes @ 100mbit")
    assert result.title == ("gpt: 100,000 parameters, micro-batch 8 per process, 1 thread(s) per process, 5 steps, "
                            "2 CPUs")
    assert messages[-1] == "wrote " + ", ".join(str(p) for p in result.paths)
    assert json.loads((tmp_path / "out" / "scaling.json").read_text())["repeats"] == 2


def test_scaling_clears_the_links_when_a_shaped_row_fails(tmp_path, events, engine):
    def answer(plan):
        if events[-2][0] == "shape" and events[-2][2] == 10**8:
            raise RunFailed("node1 exited with status 1")
        return scaling_answer(plan)

    lab = FakeLab(tmp_path, events, answer=answer)
    with pytest.raises(RunFailed, match="node1 exited"):
        scaling_run.measure(lab, scaling_run.ScalingOptions(nodes_list="2", nproc=1, host=False),
                            out_dir=tmp_path / "out")
    every = ("node0", "node1", "node2")
    assert events[-3:] == [("shape", every, 10**8), ("run", ("node0", "node1"), events[-2][2]), ("clear", every)]
    assert not (tmp_path / "out").exists()


def test_scaling_refuses_before_running_anything(tmp_path, events, engine):
    lab = FakeLab(tmp_path, events, answer=scaling_answer)
    with pytest.raises(ConfigError, match="--bw='100mbps'"):
        scaling_run.measure(lab, scaling_run.ScalingOptions(rates=("100mbps",)))
    assert events == []  # bad input is refused before the lab is asked anything
    with pytest.raises(ConfigError, match="--nodes-list='1,4': asks for 4 nodes but lab fake has 3") as info:
        scaling_run.measure(lab, scaling_run.ScalingOptions(nodes_list="1,4"))
    assert info.value.hint == "labctl up --lab fake --nodes 4, or a shorter list"
    engine["links"] = {"node2": 10**8}
    with pytest.raises(LabError, match="lab fake has shaped links") as info:
        scaling_run.measure(lab, scaling_run.ScalingOptions(rates=("none",)))
    assert "labctl shape --lab fake --clear" in info.value.hint
    assert not [e for e in events if e[0] in ("run", "shape", "clear")]


def test_scaling_host_rows_run_the_trainer_with_the_host_python(tmp_path, events, engine):
    python = tmp_path / "python"  # answers the torch probe, and prints a SUMMARY for any trainer run
    python.write_text("#!/bin/sh\n"
                      'if [ "$1" = "-c" ]; then echo 2.99.0; exit 0; fi\n'
                      f"echo 'SUMMARY {json.dumps(summary(900.0))}'\n")
    python.chmod(0o755)
    lab = FakeLab(tmp_path, events, answer=lambda plan: summary(800.0), host_python=str(python))
    messages = []
    result = scaling_run.measure(lab, scaling_run.ScalingOptions(nodes_list="1,2", rates=("none",), nproc=1),
                                 out_dir=tmp_path / "out", report=messages.append)
    assert messages[0] == f"host rows: {python}, torch 2.99.0"
    assert [r.name for r in result.rows] == ["host, 1 proc", "host, torchrun x2", "1 node", "2 nodes"]
    assert [r.tokens_per_s for r in result.rows] == [900.0, 900.0, 800.0, 800.0]
    assert (tmp_path / "out" / "host-runs" / "host-1proc" / "host.log").read_text().startswith("SUMMARY")
    assert (tmp_path / "out" / "host-runs" / "host-torchrunx2" / "host.log").is_file()
    assert not [e for e in events if e[0] in ("shape", "clear")]


@pytest.mark.parametrize("gpu", ["NVIDIA H100 80GB HBM3", None])
def test_scaling_runs_the_1_gpu_row_on_nccl_or_says_why_not(tmp_path, events, engine, monkeypatch, gpu, capsys):
    from labctl.cli import render_bench

    python = tmp_path / "python"  # answers the torch probe; a trainer run prints its argv and a SUMMARY
    python.write_text("#!/bin/sh\n"
                      'if [ "$1" = "-c" ]; then echo 2.99.0; exit 0; fi\n'
                      'echo "ARGV $* CVD=${CUDA_VISIBLE_DEVICES-unset}"\n'
                      f"echo 'SUMMARY {json.dumps(summary(900.0))}'\n")
    python.chmod(0o755)
    monkeypatch.setattr(scaling_run, "host_gpu", lambda py: gpu)
    lab = FakeLab(tmp_path, events, answer=lambda plan: summary(800.0), host_python=str(python))
    messages = []
    result = scaling_run.measure(lab, scaling_run.ScalingOptions(nodes_list="1", rates=("none",), nproc=1),
                                 out_dir=tmp_path / "out", report=messages.append)
    written = json.loads((tmp_path / "out" / "scaling.json").read_text())
    if gpu:
        assert [r.name for r in result.rows] == ["host, 1 proc", "host, 1 GPU", "1 node"]
        run_dir = tmp_path / "out" / "host-runs" / "host-1GPU"
        log = (run_dir / "host.log").read_text()
        torchrun = f"torch.distributed.run --standalone --log-dir {run_dir / 'torchrun'} --nproc-per-node 1"
        assert f"{torchrun} -m trainer" in log
        assert "--backend nccl" in log and "CVD=unset" in log
        # One GPU on the host, none in the lab: the GPU-node rows are named as not measured, once.
        assert result.notes == [scaling_run.no_gpu_nodes_note("fake", 0)] and written["host_gpu"] == gpu
    else:
        assert [r.name for r in result.rows] == ["host, 1 proc", "1 node"]
        assert "no GPU on this machine: the 1-GPU row is not measured" in messages
        assert written["notes"] == result.notes == ["no GPU on this machine: the 1-GPU row is not measured"]
        render_bench.print_scaling(result, as_json=True)
        assert json.loads(capsys.readouterr().out)["notes"] == result.notes
    cpu_log = (tmp_path / "out" / "host-runs" / "host-1proc" / "host.log").read_text()
    assert "--backend gloo" in cpu_log and "CVD=" in cpu_log and "CVD=unset" not in cpu_log


def test_host_gpu_is_none_where_the_python_says_nothing_of_a_gpu(tmp_path):
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\necho 2.99.0\n")
    python.chmod(0o755)
    assert scaling_run.host_gpu(str(python)) is None
    python.write_text("#!/bin/sh\necho gpu=NVIDIA H100\n")
    assert scaling_run.host_gpu(str(python)) == "NVIDIA H100"
    assert scaling_run.host_gpu(str(tmp_path / "no-such-python")) is None


# ------------------------------------------------------------------------------------- straggler


def straggler_answer(plan):
    """Even runs: rank 2 computes 4x slower per sample in the first one's metrics files (rank 0 in
    later ones: the split stays the first's). Balanced runs: the split asked for."""
    args = plan.launches[0].argv
    override = flag(args, "--rank-micro-batch")
    if override is None:
        plan.run_dir.mkdir(parents=True)
        first = not list(plan.run_dir.parent.glob("*/metrics-rank0.jsonl"))  # later even runs: rank 0 slow
        for rank, ms in enumerate((16.0, 16.0, 64.0) if first else (64.0, 16.0, 16.0)):
            steps = [{"kind": "step", "step": s, "compute_ms": 999.0 if s == 1 else ms} for s in (1, 2, 3)]
            (plan.run_dir / f"metrics-rank{rank}.jsonl").write_text("\n".join(map(json.dumps, steps)))
        micro, tokens, waited = [16, 16, 16], 1000.0, 0.9
    else:
        micro, tokens, waited = [int(part.split("=")[1]) for part in override.split(",")], 1500.0, 0.1
    return {"micro_batches": micro, "tokens_per_s": tokens, "step_ms": 40.0, "compute_ms_per_step": 30.0,
            "slowest_node": "node2", "slowest_compute_ratio": 1.1, "waited_for_slowest_s": waited,
            "final_loss": 4.25, "run_dir": str(plan.run_dir), "accum_steps": 1}


def test_straggler_alternates_even_and_balanced_under_the_limit(tmp_path, events, engine):
    messages = []
    result = straggler.measure(FakeLab(tmp_path, events, answer=straggler_answer),
                               straggler.StragglerOptions(cpus=0.25, micro_batch=16, steps=6, repeats=2),
                               report=messages.append)
    args = ["trainer", "--workload", "gpt", "--steps", "6", "--global-batch", "48", "--micro-batch", "16",
            "--threads", "1"]
    even = ("run", ("node0", "node1", "node2"), args + ["--backend", "gloo"])
    balanced = ("run", ("node0", "node1", "node2"), args + ["--rank-micro-batch", "0=21,1=21,2=6", "--backend", "gloo"])
    assert events == [("running",), ("check_cpu_limits", {"--cpus": 0.25}), ("cpus", "node2", 0.25),
                      even, balanced, even, balanced, ("cpus", "node2", None)]
    assert messages[0] == "node2 limited to 0.25 CPUs" and messages[-1] == "node2 CPU limit restored to none"
    assert messages[1] == "round 1, even split [16, 16, 16]: 1,000 tokens/s, slowest node2, others waited 0.90 s"
    assert messages[2] == "round 1, balanced [21, 21, 6]: 1,500 tokens/s, others waited 0.10 s"
    assert (result.node, result.global_batch, result.speedup) == ("node2", 48, 1.5)
    assert result.rank_micro_batch == "0=21,1=21,2=6"
    assert result.balanced["micro_batches"] == [21, 21, 6] and result.even["tokens_per_s_runs"] == [1000.0, 1000.0]
    assert list(result.as_dict()) == ["node", "cpus", "global_batch", "rank_micro_batch", "even", "balanced", "speedup",
                                      "timeline", "timeline_note"]
    # these fake runs leave no step times behind: no picture, and the numbers all the same
    assert result.timeline is None and result.timeline_note.startswith("no timeline picture: the metrics in")
    assert list(result.even) == [*straggler.FIGURES, "tokens_per_s_runs"]


def test_straggler_puts_the_limit_back_when_a_run_fails(tmp_path, events, engine):
    engine["cpus_before"] = 1.5

    def answer(plan):
        if "--rank-micro-batch" in plan.launches[0].argv:
            raise RunFailed("node2 exited with status 1")
        return straggler_answer(plan)

    messages = []
    with pytest.raises(RunFailed, match="node2 exited"):
        straggler.measure(FakeLab(tmp_path, events, answer=answer), straggler.StragglerOptions(node="node1", cpus=0.5),
                          report=messages.append)
    assert [e for e in events if e[0] == "cpus"] == [("cpus", "node1", 0.5), ("cpus", "node1", 1.5)]
    assert messages[-1] == "node1 CPU limit restored to 1.5 CPUs"


def test_straggler_refuses_before_changing_any_limit(tmp_path, events, engine):
    with pytest.raises(LabError, match="lab fake has 1 node; a straggler needs others to wait for it"):
        straggler.measure(FakeLab(tmp_path, events, nodes=1))
    with pytest.raises(LabError, match="no node 'node9' in lab fake") as info:
        straggler.measure(FakeLab(tmp_path, events), straggler.StragglerOptions(node="node9"))
    assert info.value.hint == "nodes: node0, node1, node2"
    engine["refuse_cpus"] = ConfigError("--cpus", 8.0, "must be at most the engine's 2 CPUs")
    with pytest.raises(ConfigError, match="at most the engine's 2 CPUs"):
        straggler.measure(FakeLab(tmp_path, events), straggler.StragglerOptions(cpus=8.0))
    assert not [e for e in events if e[0] in ("cpus", "run")]


def test_straggler_result_prints_as_json_and_as_a_table(tmp_path, events, engine, capsys):
    from labctl.cli import render_bench

    result = straggler.measure(FakeLab(tmp_path, events, answer=straggler_answer),
                               straggler.StragglerOptions(repeats=1))
    render_bench.print_straggler(result, as_json=True)
    assert json.loads(capsys.readouterr().out) == result.as_dict()
    render_bench.print_straggler(result, as_json=False)
    out = capsys.readouterr().out
    assert "node2 at 0.25 CPUs, global batch 48, 30 steps, median of 1" in out
    assert "--rank-micro-batch 0=21,1=21,2=6" in out and "balanced / even tokens/s: 1.50x" in out


# ------------------------------------------------------------------------ matplotlib, an extra


@pytest.fixture
def no_matplotlib(monkeypatch):
    """matplotlib as it is where the `plot` extra was not installed: not importable."""
    import sys

    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)


def test_allreduce_plot_without_matplotlib_is_refused_before_measuring(tmp_path, events, engine, no_matplotlib):
    with pytest.raises(StateError, match="bench allreduce --plot draws with matplotlib, which is not installed") as info:
        allreduce.measure(FakeLab(tmp_path, events), [1024], 1, plot_path=tmp_path / "a.png")
    assert info.value.exit_code == 1 and "ddplab[plot]" in info.value.hint and events == []


def test_allreduce_plot_cli_without_matplotlib_names_the_extra(tmp_path, monkeypatch, no_matplotlib):
    from click.testing import CliRunner

    from labctl.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")  # refused before the engine is asked
    result = CliRunner().invoke(main, ["bench", "allreduce", "--plot", "a.png"], catch_exceptions=False)
    assert result.exit_code == 1 and "pip install 'ddplab[plot]'" in " ".join(result.output.split())


def test_scaling_without_matplotlib_writes_the_table_and_says_so(tmp_path, events, engine, no_matplotlib):
    messages = []
    result = scaling_run.measure(FakeLab(tmp_path, events, answer=scaling_answer),
                                 scaling_run.ScalingOptions(nodes_list="1,2", rates=("none",), nproc=1, steps=5,
                                                            host=False),
                                 out_dir=tmp_path / "out", report=messages.append)
    assert messages[0].startswith("matplotlib is not installed: scaling.md and scaling.json only, no PNGs")
    assert [p.name for p in result.paths] == ["scaling.md", "scaling.json"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["scaling.json", "scaling.md"]


def test_collectives_sweep_every_op_through_the_same_bench_and_write_their_own_rows(tmp_path, events, engine,
                                                                                    monkeypatch):
    monkeypatch.setattr(allreduce, "measure_wire", lambda *args: 9e8)
    timings = [{"op": "all_reduce", "size": 1024, "count": 256, "time_us": 400.0, "probe": True}] + [
        {"op": op, "size": 3072, "count": 768, "time_us": 500.0} for op in ("all_gather", "reduce_scatter")]

    def answer(plan):
        plan.run_dir.mkdir(parents=True)
        (plan.run_dir / "collectives.json").write_text(json.dumps(timings))
        return {}

    result = allreduce.measure_collectives(FakeLab(tmp_path, events, answer=answer), ["all_gather", "reduce_scatter"],
                                           [3072], 3)
    assert events[-1][2][:3] == ["trainer.bench_collectives", "--ops", "all_gather,reduce_scatter"]
    assert [r.op for r in result.rows] == ["all_gather", "reduce_scatter"] and result.title.startswith("collectives on")
    written = json.loads((result.run_dir / "bench-collectives.json").read_text())
    assert [(r["op"], r["size"]) for r in written] == [("all_gather", 3072), ("reduce_scatter", 3072)]
    with pytest.raises(ConfigError, match="'gather' is none of them|names ops"):
        allreduce.measure_collectives(FakeLab(tmp_path, events), ["all_gather", "gather"], [3072], 3)
