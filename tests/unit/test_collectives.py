"""Every collective a step calls, recorded by kind (trainer/collectives.py), summed in the SUMMARY and
put on the merged trace's lanes (labctl/trace/chrome.py). An fsdp run under torchrun on this machine,
every rank's calls named, is in tests/host/test_collectives.py."""

import pytest
import torch
import torch.distributed as dist

from labctl.trace.chrome import FIRST_COLLECTIVE_TID, collective_events
from labctl.trace.records import Collective, Step
from trainer.collectives import Call, CollectiveLog, in_flight_ms, summarize_calls, totals


@pytest.fixture
def world_of_one(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_each_kind_is_recorded_with_its_message_bytes_inside_a_step_only(world_of_one):
    log = CollectiveLog.install()
    assert CollectiveLog.install() is log  # one per process: torch.distributed is wrapped once
    full, part = torch.ones(8), torch.ones(8)
    dist.all_reduce(full)  # outside a step: not recorded
    log.start_step()
    dist.all_reduce(full)
    dist.all_gather_single(full, part)
    dist.reduce_scatter_single(part, full)
    dist.broadcast(torch.ones(4, dtype=torch.float64), src=0)
    dist.all_reduce(torch.ones(2), async_op=True).wait()
    calls = log.end_step()
    dist.all_reduce(full)  # after the step: not recorded either
    assert [(c.kind, c.bytes, c.blocking) for c in calls] == [
        ("all_reduce", 32, True), ("all_gather", 32, True), ("reduce_scatter", 32, True), ("broadcast", 32, True),
        ("all_reduce", 8, False)]
    assert all(c.done is not None and c.done >= c.launched for c in calls)  # the async one's future stamped it


def test_the_summary_is_per_step_calls_and_bytes_and_the_mean_time_over_ranks_and_steps():
    def step(ms):
        return [Call("all_gather", 0.0, 100, True, ms / 1e3), Call("reduce_scatter", 0.0, 50, True, 0.001)]

    summary = summarize_calls([totals([step(2.0), step(4.0)]), totals([step(6.0), step(8.0)])])
    assert summary == {"all_gather": {"calls": 1.0, "bytes": 100, "ms": 5.0},
                       "reduce_scatter": {"calls": 1.0, "bytes": 50, "ms": 1.0}}
    assert summarize_calls([totals([[], []])]) == {}  # a world of one calls none
    assert totals([step(2.0)]) == {"steps": 1, "all_gather": [1, 100, pytest.approx(2.0)],
                                   "reduce_scatter": [1, 50, pytest.approx(1.0)]}


def test_calls_launched_together_count_their_time_in_flight_once():
    calls = [Call("broadcast", 0.0, 8, False, 0.010), Call("broadcast", 0.0, 8, False, 0.020),
             Call("broadcast", 0.005, 8, False, 0.015), Call("broadcast", 0.030, 8, True, 0.035),
             Call("broadcast", 0.040, 8, False, None)]  # its end unknown: not counted
    assert in_flight_ms(calls) == pytest.approx(25.0)


def test_calls_in_flight_together_go_on_lanes_of_their_own():
    calls = (Collective("all_gather", 10.0, 10.5, 64), Collective("all_gather", 10.2, 10.6, 64),
             Collective("reduce_scatter", 10.7, 10.8, 32), Collective("all_reduce", 10.9, None, 8))
    events = collective_events(3, [Step(1, 10.0, 11.0, 11.0, collectives=calls)], offset=0.0, origin=10.0)
    timed = [e for e in events if e["ph"] in ("X", "i")]
    assert [(e["name"], e["tid"] - FIRST_COLLECTIVE_TID) for e in timed] == [
        ("all_gather", 0), ("all_gather", 1), ("reduce_scatter", 0), ("all_reduce", 0)]
    assert timed[1]["ts"] == pytest.approx(200_000) and timed[1]["dur"] == pytest.approx(400_000)
    assert timed[3]["ph"] == "i"  # its end is not known
    assert {e["args"]["name"] for e in events if e["ph"] == "M"} == {"collectives 1 (metrics)", "collectives 2 (metrics)"}
