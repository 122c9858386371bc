"""The collectives an fsdp run calls (trainer/collectives.py), under torchrun on this machine: summed in
the SUMMARY and named on every rank's lanes of the merged trace (labctl/trace/chrome.py)."""

import json

from hostrun import torchrun

from labctl.trace import write_trace


def test_an_fsdp_run_names_its_all_gathers_and_reduce_scatters_in_the_summary_and_on_every_ranks_lanes(tmp_path):
    out = torchrun(tmp_path / "torchrun", "-m", "trainer", "--workload", "gpt", "--steps", "3", "--strategy", "fsdp",
                   "--run-dir", tmp_path / "run", "--data-dir", tmp_path / "data", timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(next(line for line in out.stdout.splitlines() if "SUMMARY " in line).split("SUMMARY ", 1)[1])
    per_step = summary["collectives_per_step"]
    blocks = 2  # gpt's default --n-layer: one FSDP unit each, and the root
    # Each block's parameters are gathered before forward and again before backward; the root's stay
    # gathered from forward to backward (FSDP2 does not reshard the root). Every unit's gradients once.
    assert per_step["all_gather"]["calls"] == 2 * blocks + 1 and per_step["reduce_scatter"]["calls"] == blocks + 1
    assert set(per_step) == {"all_gather", "reduce_scatter"} and all(v["ms"] > 0 for v in per_step.values())
    # The gradients reduce-scattered are the parameters' bytes (padded to a multiple of the world size).
    params_bytes = sum(summary["state_bytes"]["params"] for _ in range(2))
    assert params_bytes <= per_step["reduce_scatter"]["bytes"] <= params_bytes * 1.01
    write_trace(tmp_path / "run")
    events = json.loads((tmp_path / "run" / "trace-merged.json").read_text())["traceEvents"]
    for rank in (0, 1):
        named = {e["name"] for e in events if e["pid"] == rank and e.get("cat") == "collective"}
        assert named == {"all_gather", "reduce_scatter"}, (rank, named)
