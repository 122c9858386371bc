"""bench scaling and bench straggler: the row plan, the table arithmetic, and the balancing split."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from labctl.bench import scaling, scaling_run, straggler
from labctl.errors import ConfigError


def test_plan_has_every_row_the_table_needs():
    names = [c.name for c in scaling.plan([1, 2, 3], [("1gbit", 10**9), ("100mbit", 10**8)], nproc=3)]
    assert names == ["host, 1 proc", "host, torchrun x2", "host, torchrun x3", "node0 x 3 procs",
                     "1 node", "2 nodes", "3 nodes", "2 nodes @ 1gbit", "3 nodes @ 1gbit",
                     "2 nodes @ 100mbit", "3 nodes @ 100mbit"]
    lab_only = scaling.plan([2], [], nproc=1, host=False)
    assert [(c.name, c.world_size) for c in lab_only] == [("2 nodes", 2)]


def test_delay_goes_on_every_shaped_row_and_into_its_model():
    configs = scaling.plan([1, 2], [("1gbit", 10**9)], nproc=1, host=False, delay=("5ms", 0.005))
    assert [(c.name, c.bw, c.delay_s) for c in configs] == [
        ("1 node", None, 0.0), ("2 nodes", None, 0.0), ("2 nodes @ 1gbit + 5ms", "1gbit + 5ms", 0.005)]
    # 2 ranks: 2 hops, each 50 us plus the 5 ms delay, on top of the bytes
    plain = scaling.model_ms(100_000, 2, 10**9, 0.85)
    assert scaling.model_ms(100_000, 2, 10**9, 0.85, delay_s=0.005) == pytest.approx(plain + 2 * 5.0)


def test_a_delay_needs_shaped_rows_and_a_time():
    assert scaling_run.shaped_delay(None, []) is None
    assert scaling_run.shaped_delay("10ms", [("1gbit", 10**9)]) == ("10ms", 0.01)
    with pytest.raises(ConfigError, match="--bw none leaves no shaped row"):
        scaling_run.shaped_delay("10ms", [])
    with pytest.raises(ConfigError, match="must be a time such as 10ms"):
        scaling_run.shaped_delay("ten", [("1gbit", 10**9)])


@pytest.mark.parametrize("has_gpu", [True, False])
def test_the_1_gpu_row_is_planned_only_where_the_host_has_a_gpu(has_gpu):
    configs = scaling.plan([1, 2], [], nproc=1, gpu=has_gpu)
    names = [c.name for c in configs]
    assert names == ["host, 1 proc", *(["host, 1 GPU"] if has_gpu else []), "host, torchrun x2", "1 node", "2 nodes"]
    if has_gpu:
        [row] = [c for c in configs if c.device == "cuda"]
        assert (row.place, row.world_size) == ("host", 1)  # the same workload and global batch as 1 process
    assert [c.name for c in scaling.plan([2], [], nproc=1, host=False, gpu=True)] == ["2 nodes"]


def test_the_gpu_row_is_measured_against_the_cpu_baseline_not_taken_for_it():
    configs = scaling.plan([2], [], nproc=1, gpu=True)
    summaries = {"host, 1 proc": [summary(1000)], "host, 1 GPU": [summary(20000)],
                 "host, torchrun x2": [summary(1800)], "2 nodes": [summary(1600)]}
    rows = {r.name: r for r in scaling.build_rows(configs, summaries, 0.85)}
    assert rows["host, 1 GPU"].efficiency == 20.0 and rows["host, 1 GPU"].device == "cuda"
    assert rows["2 nodes"].efficiency == 0.8
    assert "no GPU on this machine" in scaling.markdown(list(rows.values()), "t", [scaling.NO_GPU_NOTE])


def test_gpu_node_rows_run_where_the_labs_first_nodes_have_gpus_and_stay_out_of_the_cpu_ratios():
    configs = scaling.plan([1, 2, 3], [("1gbit", 10**9)], nproc=1, host=False, gpu_nodes=2)
    assert [(c.name, c.device, c.rate_bps) for c in configs if c.device == "cuda"] == [
        ("2 GPU nodes", "cuda", None), ("2 GPU nodes @ 1gbit", "cuda", 10**9)]
    assert not [c for c in scaling.plan([1, 2, 3], [], nproc=1, host=False, gpu_nodes=1) if c.device == "cuda"]
    configs = scaling.plan([2], [], nproc=1, gpu_nodes=2)
    summaries = {"host, 1 proc": [summary(1000)], "host, torchrun x2": [summary(1800)], "2 nodes": [summary(1600)],
                 "2 GPU nodes": [summary(30000)]}
    rows = scaling.build_rows(configs, summaries, 0.85)
    assert scaling.ratio_rows(rows) == [(2, 1600, 1800, 1600 / 1800)]
    assert "--nodes 2 --gpus 2" in scaling.no_gpu_nodes_note("lab", 0)


def test_lab_rows_name_their_backend_whatever_the_env_files_say():
    class Session:
        def __init__(self):
            self.argv = []

        def node_env(self):
            return {"node0": {}, "node1": {}}

        def plan_run(self, *argv, **_):
            self.argv.append(list(argv))
            raise StopIteration

    session = Session()
    for device in ("cpu", "cuda"):
        with pytest.raises(StopIteration):
            scaling_run.run_lab(session, scaling.Config("r", "lab", 2, 1, device=device), ["--steps", "1"])
    assert [argv[-2:] for argv in session.argv] == [["--backend", "gloo"], ["--backend", "nccl"]]


def summary(tokens, compute=10.0, allreduce=2.0, params=100_000):
    return {"tokens_per_s": tokens, "step_ms": compute + allreduce + 1, "compute_ms_per_step": compute,
            "allreduce_ms_per_step": allreduce, "comm_fraction": 0.2, "params": params}


def test_rows_take_medians_and_measure_efficiency_against_one_process():
    configs = scaling.plan([1, 2], [("100mbit", 10**8)], nproc=1)
    summaries = {
        "host, 1 proc": [summary(1000, allreduce=0), summary(1200, allreduce=0), summary(900, allreduce=0)],
        "host, torchrun x2": [summary(1800)],
        "1 node": [summary(1100, allreduce=0)],
        "2 nodes": [summary(1700)],
        "2 nodes @ 100mbit": [summary(500, allreduce=40.0)],
    }
    rows = {r.name: r for r in scaling.build_rows(configs, summaries, efficiency=0.85)}
    assert rows["host, 1 proc"].tokens_per_s == 1000 and rows["host, 1 proc"].efficiency == 1.0
    assert rows["2 nodes"].efficiency == 0.85  # 1700 / (2 x 1000)
    shaped = rows["2 nodes @ 100mbit"]
    # ring: 2(n-1)/n x 400 KB of fp32 gradients = 400 KB over 85 Mbit/s, plus 2 hops x 50 us
    assert shaped.model_ms_per_step == pytest.approx(400_000 * 8 / 85e6 * 1e3 + 0.1)
    assert shaped.comm_over_compute == 4.0 and shaped.bw == "100mbit"
    assert rows["2 nodes"].model_ms_per_step is None and rows["1 node"].model_ms_per_step == 0.0
    assert scaling.ratio_rows(list(rows.values())) == [(2, 1700, 1800, pytest.approx(1700 / 1800))]
    md = scaling.markdown(list(rows.values()), "t")
    assert "| 2 nodes @ 100mbit | 2 x 1 | 100mbit | 500 |" in md and "| 2 | 1,700 | 1,800 | 0.94 |" in md


def test_rows_that_trained_on_different_corpora_are_refused():
    configs = scaling.plan([2], [], nproc=1)
    same = {"host, 1 proc": [{**summary(1000, allreduce=0), "corpus_sha256": "a" * 64}],
            "host, torchrun x2": [{**summary(1800), "corpus_sha256": "a" * 64}],
            "2 nodes": [{**summary(1700), "corpus_sha256": "a" * 64}]}
    assert len(scaling.build_rows(configs, same, efficiency=0.85)) == 3
    mixed = {**same, "2 nodes": [{**summary(1700), "corpus_sha256": "b" * 64}]}
    with pytest.raises(scaling.RunFailed, match=r"different corpora \(host, 1 proc, host, torchrun x2: sha256 aaaaaaaaaaaa; "
                                                r"2 nodes: sha256 bbbbbbbbbbbb\)"):
        scaling.build_rows(configs, mixed, efficiency=0.85)


def test_the_host_rows_python_must_have_torch(tmp_path):
    import sys

    bare = tmp_path / "python"  # this very Python without its site-packages: a Python without torch
    bare.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    bare.chmod(0o755)
    with pytest.raises(scaling_run.StateError, match=f"with {bare}, which cannot import torch") as info:
        scaling_run.host_torch(str(bare))
    assert info.value.exit_code == 1  # the machine's state, not bad input
    assert "make host-torch" in info.value.hint and "--no-host" in info.value.hint
    with pytest.raises(scaling_run.LabError, match="cannot run the host rows' Python"):
        scaling_run.host_torch(str(tmp_path / "no-such-python"))


def test_summary_line_is_found_or_the_failure_is_clear():
    assert scaling_run.parse_summary(["x", 'node0 | SUMMARY {"a": 1}', "y"]) == {"a": 1}
    from labctl.errors import RunFailed

    with pytest.raises(RunFailed, match="no SUMMARY"):
        scaling_run.parse_summary(["Traceback"])


def test_outputs_are_written(tmp_path):
    configs = scaling.plan([1, 2], [], nproc=2)
    summaries = {c.name: [summary(1000 * c.world_size)] for c in configs}
    rows = scaling.build_rows(configs, summaries, 0.85)
    paths = scaling.write_outputs(rows, tmp_path, "title", {"steps": 5})
    assert sorted(p.name for p in paths) == ["breakdown.png", "scaling.json", "scaling.md", "scaling.png"]
    data = json.loads((tmp_path / "scaling.json").read_text())
    assert data["steps"] == 5 and [r["name"] for r in data["rows"]] == [c.name for c in configs]
    assert all((tmp_path / name).stat().st_size > 5_000 for name in ("scaling.png", "breakdown.png"))


@given(total=st.integers(1, 512), ms=st.lists(st.floats(0.01, 100.0), min_size=1, max_size=16))
def test_balanced_split_keeps_the_total_and_every_rank(total, ms):
    if total < len(ms):
        with pytest.raises(ValueError):
            straggler.balanced_micro_batches(total, ms)
        return
    sizes = straggler.balanced_micro_batches(total, ms)
    assert sum(sizes) == total and min(sizes) >= 1 and len(sizes) == len(ms)
    fastest, slowest = ms.index(min(ms)), ms.index(max(ms))
    assert sizes[fastest] >= sizes[slowest]


def test_balanced_split_follows_speed():
    assert straggler.balanced_micro_batches(48, [1.0, 1.0, 4.0]) == [21, 21, 6]
    assert straggler.balanced_micro_batches(48, [1.0, 1.0, 1.0]) == [16, 16, 16]


def test_compute_per_sample_reads_steady_steps(tmp_path):
    for rank, ms in enumerate((8.0, 32.0)):
        lines = [{"kind": "step", "step": 1, "compute_ms": 999.0}] + [{"kind": "step", "step": s, "compute_ms": ms}
                                                                    for s in (2, 3)]
        (tmp_path / f"metrics-rank{rank}.jsonl").write_text("\n".join(map(json.dumps, lines)))
    assert straggler.compute_ms_per_sample(tmp_path, [8, 8], 2) == [0.5, 2.0]
    from labctl.errors import RunFailed

    with pytest.raises(RunFailed, match="rank 2"):
        straggler.compute_ms_per_sample(tmp_path, [8, 8, 8], 1)


def test_bench_straggler_pipeline_runs_a_stage_a_node_in_two_micro_batches_a_stage():
    from labctl.errors import LabError

    options = straggler.StragglerOptions(pipeline=8)
    runs = straggler.pipeline_args(options, 3, 48)
    assert runs["pp-even"] == ["--strategy", "pp", "--schedule", "1f1b", "--micro-batches", "6"]
    assert runs["pp-auto"] == runs["pp-even"] + ["--stage-layers", "auto"]
    assert straggler.pipeline_args(options, 3, 45)["pp-even"][-1] == "3"  # 45 does not split in 6: one a stage
    assert straggler.pipeline_args(straggler.StragglerOptions(), 3, 48) == {}
    for wrong, nodes in ((straggler.StragglerOptions(pipeline=2), 3), (straggler.StragglerOptions(pipeline=8, workload="toy"), 3)):
        with pytest.raises(LabError, match="a stage a node"):
            straggler.pipeline_args(wrong, nodes, 48)
