"""Link shaping measured for real: tc in the nodes' namespaces, gloo allreduce across them,
iperf3 on the wire, all against the cost model."""

from __future__ import annotations

import json

import pytest

from conftest import labctl

pytestmark = pytest.mark.alone  # it measures the ring's bandwidth against the shaped link

TOLERANCE = 0.15  # shaped bandwidth within 15% (mininet's assertWithinTolerance, in spirit)


def bench(lab: str, sizes: str) -> list[dict]:
    result = labctl("bench", "allreduce", "--lab", lab, "--sizes", sizes, "--iters", "3", "--json", check=True, timeout=600)
    return json.loads(result.stdout)


def links(lab: str) -> dict[str, str]:
    status = json.loads(labctl("status", "--lab", lab, "--json", check=True).stdout)
    return {n["name"]: n["link"] for n in status["nodes"]}


def within(measured: float, expected: float, fraction: float = TOLERANCE) -> bool:
    return abs(measured - expected) <= fraction * expected


@pytest.fixture(scope="module")
def lab(lab3):
    name, _ = lab3
    yield name
    labctl("shape", "--lab", name, "--clear")


def test_100mbit_ring_runs_at_the_link_rate_and_the_model(lab):
    labctl("shape", "--lab", lab, "--bw", "100mbit", check=True)
    assert set(links(lab).values()) == {"100mbit"}  # read back from the kernel
    rows = bench(lab, "4M")  # 0.47 s a call at 100mbit: the link's rate, well past tbf's 128 KiB burst
    assert len(rows) == 1, rows  # the latency probe calibrates the model; it is not a row
    row = rows[0]
    assert row["size"] == 4 * 2**20 and row["count"] == 2**20
    assert within(row["busbw_gbs"], 0.0125), f"busbw {row['busbw_gbs']:.4f} GB/s vs link 0.0125"
    assert 0.85 <= row["meas_over_model"] <= 1.15, row
    assert 0.8 <= row["busbw_over_wire"] <= 1.1, row
    assert 0.9 <= row["meas_over_calibrated"] <= 1.1, row  # the cost model page's goal is 0.95-1.05, measured by the bench


def test_one_slow_node_drags_the_whole_ring(lab):
    labctl("shape", "--lab", lab, "--bw", "100mbit", check=True)
    labctl("shape", "--lab", lab, "--node", "node2", "--bw", "50mbit", check=True)
    assert links(lab) == {"node0": "100mbit", "node1": "100mbit", "node2": "50mbit"}
    row = bench(lab, "2M")[-1]  # 0.45 s a call at 50mbit
    assert within(row["busbw_gbs"], 50e6 / 8 / 1e9), f"busbw {row['busbw_gbs']:.4f} GB/s vs 50mbit = 0.00625"


def test_clear_brings_the_bandwidth_back(lab):
    labctl("shape", "--lab", lab, "--bw", "100mbit", check=True)
    labctl("shape", "--lab", lab, "--clear", check=True)
    assert set(links(lab).values()) == {"unshaped"}
    row = bench(lab, "16M")[-1]
    assert row["busbw_gbs"] > 5 * 0.0125, row


def test_delay_applies_where_netem_exists_and_fails_cleanly_where_not(lab, docker_client):
    """One test for both kernels: never a skip."""
    labctl("shape", "--lab", lab, "--clear", check=True)
    result = labctl("shape", "--lab", lab, "--bw", "100mbit", "--delay", "10ms")
    if result.returncode == 0:
        rtt_ms = connect_rtt_ms(docker_client, lab)
        labctl("shape", "--lab", lab, "--clear", check=True)
        base_ms = connect_rtt_ms(docker_client, lab)
        assert within(rtt_ms - base_ms, 20.0, 0.1), f"delay 10ms on both ends should add 20 ms, got {rtt_ms - base_ms:.1f}"
    else:
        assert result.returncode == 1  # the kernel's state, not the command
        assert "sch_netem" in result.stderr and "Rate shaping" in result.stderr and "Traceback" not in result.stderr
        assert set(links(lab).values()) == {"unshaped"}  # no half-applied shape, no qdisc left behind


def connect_rtt_ms(client, lab: str) -> float:
    """Median TCP connect time node0 -> node1 (one SYN/SYN-ACK round trip)."""
    node1 = client.containers.get(f"{lab}-node1")
    node1.exec_run(["python", "-c", "import socket,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
                                    "s.bind(('0.0.0.0', 5999)); s.listen(64); time.sleep(30)"], detach=True)
    ip = node1.attrs["NetworkSettings"]["Networks"][f"{lab}-net"]["IPAddress"]
    script = ("import socket,statistics,time\n"
              "for _ in range(100):\n"
              "    try: socket.create_connection((%r, 5999), timeout=1).close(); break\n"
              "    except OSError: time.sleep(0.05)\n"
              "ts=[]\n"
              "for _ in range(9):\n"
              "    t=time.perf_counter(); c=socket.create_connection((%r, 5999)); ts.append(time.perf_counter()-t); c.close()\n"
              "print(statistics.median(ts)*1000)\n") % (ip, ip)
    out = client.containers.get(f"{lab}-node0").exec_run(["python", "-c", script]).output.decode()
    node1.exec_run(["pkill", "-f", "5999"])
    return float(out.strip().splitlines()[-1])


def test_all_gather_and_reduce_scatter_run_as_the_calibrated_model_says_gloo_runs_them(lab):
    """gloo's all-gather is a ring, its reduce-scatter an all-reduce of the whole input (cost.op_cost):
    at 1gbit the reduce-scatter takes about twice the all-gather's time and moves twice its bytes
    for the same bus-bandwidth factor, as the calibrated model prices them. Checked as ratios of the
    two ops measured side by side in one sweep, so a busy machine's load falls on both.

    Each row's own time against the calibrated model is the bench's to measure (its goal is 0.95 to
    1.05; docs/explanation/cost-model.md): on the EPYC of 2026-11-29 the rows read 0.87 to 1.11, on
    the slower one of 2026-12-01 the 1 MiB rows 1.01 to 1.16 idle and up to 1.30 beside make test's
    unit tests (1.70 once in CI, 2026-12-02), the 4 MiB all-gather 0.95 to 0.97 idle and 1.09 beside
    them: the model hides the ring's per-step stack cost behind the transfer, which a slower or busier
    stack does not. That cost is fixed per step, so the sweep is 4 MiB and 16 MiB, where it is a
    quarter and a sixteenth of what it was at 1 MiB. Each row is held to 0.8 to 1.5, which fails a
    model that prices the wrong algorithm (an all-gather priced as an all-reduce, twice its steps and
    bytes, reads about 0.6); the spread itself is what a calibration that carries its own (issue 61)
    will show."""
    labctl("shape", "--lab", lab, "--bw", "1gbit", check=True)
    result = labctl("bench", "collectives", "--lab", lab, "--ops", "all_gather,reduce_scatter", "--sizes", "4M,16M",
                    "--iters", "3", "--json", check=True, timeout=600)
    rows = json.loads(result.stdout)
    assert [(r["op"], r["size"]) for r in rows] == [("all_gather", 4194300), ("all_gather", 16777212),
                                                    ("reduce_scatter", 4194300), ("reduce_scatter", 16777212)]
    for row in rows:
        assert 0.8 <= row["meas_over_calibrated"] <= 1.5, row
    for gather, scatter in ((rows[0], rows[2]), (rows[1], rows[3])):
        measured, modeled = (scatter["time_us"] / gather["time_us"],
                             scatter["calibrated_us"] / gather["calibrated_us"])
        assert 1.5 <= modeled <= 2.1 and 0.8 <= measured / modeled <= 1.2, (measured, modeled, gather, scatter)
    gather, scatter = rows[0], rows[2]
    # nccl-tests' busbw factor is (n-1)/n for both; gloo's reduce-scatter moves twice the bytes for it
    assert 0.4 <= scatter["busbw_gbs"] / gather["busbw_gbs"] <= 0.6, (gather, scatter)
    assert 0.7 <= gather["busbw_over_wire"] <= 1.1, gather  # the ring runs at the wire's rate, less its copies
