"""doctor's checks on the facts gathered from the nodes: each misconfiguration named, with its node and fix."""

import pytest

from labctl.diagnose.doctor import check_env, check_iface, check_reach, check_versions


def env(rank, n=3, host=None, **over):
    e = {"NODE_RANK": str(rank), "WORLD_SIZE": str(n), "NNODES": str(n), "NPROC_PER_NODE": "1",
         "MASTER_ADDR": "172.28.0.10", "MASTER_PORT": "29500", "GLOO_SOCKET_IFNAME": "eth0",
         "PET_RDZV_CONF": f"is_host={'true' if (rank == 0 if host is None else host) else 'false'}"}
    e.update(over)
    return {k: v for k, v in e.items() if v is not None}


def good_envs(n=3):
    return {f"node{i}": env(i, n) for i in range(n)}


def failures(findings):
    return [(f.check, f.node) for f in findings if not f.ok]


def test_a_good_lab_passes_every_check():
    assert failures(check_env(good_envs())) == []
    info = {f"node{i}": {"torch": "2.13.0+cpu", "python": "3.11.2", "ifaces": {"lo": ["127.0.0.1/8"], "eth0": [f"172.28.0.1{i}/24"]}}
            for i in range(3)}
    assert failures(check_versions(info)) == []
    assert failures(check_iface(info, good_envs(), "172.28.0.0/24")) == []


def test_duplicate_rank_names_both_nodes_and_the_missing_rank():
    envs = good_envs()
    envs["node2"] = env(0, host=False)
    found = check_env(envs)
    assert ("env", "node0") in failures(found) and ("env", "node2") in failures(found)
    assert any("NODE_RANK=0 on node0 and node2" in f.message for f in found)
    assert any("no node has NODE_RANK 2" in f.message for f in found)


@pytest.mark.parametrize("hosts, expected", [((False, False, False), "no node"), ((True, True, False), "node0, node1")])
def test_is_host_must_be_on_exactly_one_node(hosts, expected):
    envs = {f"node{i}": env(i, host=h) for i, h in enumerate(hosts)}
    [finding] = [f for f in check_env(envs) if not f.ok]
    assert f"is_host=true on {expected}" in finding.message and "client socket has timed out" in finding.message


def test_disagreeing_world_size_and_master_are_pinned_on_the_odd_node():
    envs = good_envs()
    envs["node1"]["WORLD_SIZE"] = "4"
    envs["node2"]["MASTER_PORT"] = "29501"
    assert sorted(failures(check_env(envs))) == [("env", "node1"), ("env", "node2")]


def test_unset_socket_interface_is_flagged():
    envs = good_envs()
    envs["node1"] = env(1, GLOO_SOCKET_IFNAME=None)
    assert failures(check_env(envs)) == [("env", "node1")]


def test_version_mismatch_names_the_odd_node():
    info = {"node0": {"torch": "2.13.0+cpu", "python": "3.11.2"}, "node1": {"torch": "2.13.0+cpu", "python": "3.11.2"},
            "node2": {"torch": "2.14.1+cu128", "python": "3.11.2"}}
    [finding] = [f for f in check_versions(info) if not f.ok]
    assert finding.node == "node2" and "torch 2.14.1+cu128 here, 2.13.0+cpu on the other nodes" in finding.message


def test_cpu_and_cuda_builds_of_one_release_may_mix_but_cuda_nodes_must_agree():
    """`up --cuda 2`: CPU-image and CUDA-image nodes train together with gloo."""
    cpu = {"torch": "2.13.0+cpu", "python": "3.11.2", "cuda": None, "nccl": None}
    cuda = {"torch": "2.13.0+cu128", "python": "3.11.2", "cuda": "12.8", "nccl": "2.27.3"}
    assert failures(check_versions({"node0": cuda, "node1": cuda, "node2": cpu})) == []
    odd = {**cuda, "nccl": "2.21.5"}
    [finding] = [f for f in check_versions({"node0": cuda, "node1": odd, "node2": cuda, "node3": cpu}) if not f.ok]
    assert finding.node == "node1" and "nccl 2.21.5 here, 2.27.3 on the other GPU nodes" in finding.message


def test_missing_interface_and_address_off_the_subnet():
    envs = good_envs(2)
    envs["node1"]["GLOO_SOCKET_IFNAME"] = "eth9"
    info = {"node0": {"ifaces": {"eth0": ["10.0.0.5/24"]}}, "node1": {"ifaces": {"eth0": ["172.28.0.11/24"]}}}
    found = {f.node: f for f in check_iface(info, envs, "172.28.0.0/24") if not f.ok}
    assert "none on the lab subnet 172.28.0.0/24" in found["node0"].message
    assert "Unable to find address for: eth9" in found["node1"].message and "eth0 (172.28.0.11/24)" in found["node1"].message


def test_reachability_separates_rendezvous_from_back_connect_ports():
    master = ("node0", "172.28.0.10", 29500)
    results = {
        "node0": {"bind_errors": {}, "results": [["node1", "172.28.0.11", 45000, "timeout", 1500],
                                                 ["node2", "172.28.0.12", 45000, "ok", 1]]},
        "node1": {"bind_errors": {}, "results": [["node0", "172.28.0.10", 45000, "ok", 1],
                                                 ["node2", "172.28.0.12", 45000, "ok", 1],
                                                 ["node0", "172.28.0.10", 29500, "ok", 1]]},
        "node2": {"bind_errors": {}, "results": [["node0", "172.28.0.10", 45000, "ok", 1],
                                                 ["node1", "172.28.0.11", 45000, "timeout", 1500],
                                                 ["node0", "172.28.0.10", 29500, "ok", 1]]},
    }
    found = check_reach(results, master, 45000)
    assert [f.ok for f in found if f.check == "rendezvous"] == [True]
    bad = [f for f in found if f.check == "ports" and not f.ok]
    assert [f.node for f in bad] == ["node0", "node2"]
    assert all("cannot reach node1" in f.message and "ephemeral" in f.message for f in bad)


def test_master_port_in_use_and_unreachable_rendezvous():
    master = ("node0", "172.28.0.10", 29500)
    results = {"node0": {"bind_errors": {"29500": "Address in use"}, "results": []},
               "node1": {"bind_errors": {}, "results": [["node0", "172.28.0.10", 29500, "refused", 1500]]}}
    found = failures(check_reach(results, master, 45000))
    assert found == [("rendezvous", "node0"), ("rendezvous", "node1")]


def test_uneven_cpu_limits_name_the_slow_node():
    from labctl.diagnose.doctor import check_cpus

    assert failures(check_cpus({"node0": None, "node1": None})) == []
    assert failures(check_cpus({"node0": 1.0, "node1": 1.0})) == []
    [slow] = [f for f in check_cpus({"node0": None, "node1": 0.25}) if not f.ok]
    assert slow.node == "node1" and "0.25 CPUs, the others to none" in slow.message
    assert failures(check_cpus({"node0": 1.0, "node1": 0.5, "node2": 1.0})) == [("cpus", "node1")]


def test_scenario_reports_group_findings_and_find_the_symptom():
    from types import SimpleNamespace

    from labctl.diagnose.scenarios import SCENARIOS, first_symptom, group_findings
    from labctl.diagnose.findings import Finding

    same = "NODE_RANK=0 on node0 and node1"
    assert group_findings([Finding("env", "node0", False, same), Finding("env", "node1", False, same),
                           Finding("env", "all", False, "no node has NODE_RANK 1")]) == [
        f"node0, node1: {same}", "no node has NODE_RANK 1"]
    outcomes = [SimpleNamespace(lines=["starting", "torch.distributed.DistNetworkError: The client socket has timed "
                                       "out after 10000ms while trying to connect to (100.101.0.10, 29500)."])]
    assert first_symptom(SCENARIOS["hostname-trap"].symptom, outcomes).startswith("DistNetworkError: The client socket")
    assert first_symptom(SCENARIOS["straggler"].symptom, outcomes) == ""


def test_a_cpu_imbalance_warns_but_does_not_block():
    from labctl.diagnose.doctor import check_cpus

    [slow] = [f for f in check_cpus({"node0": None, "node1": 0.25}) if not f.ok]
    assert slow.warn and not slow.blocking
    [bad] = [f for f in check_env({"node0": env(0, n=2, GLOO_SOCKET_IFNAME=None), "node1": env(1, n=2)}) if not f.ok]
    assert bad.blocking


def test_world_size_is_the_sum_of_every_nodes_processes():
    mixed = {f"node{i}": env(i, 2) for i in range(2)}
    mixed["node0"]["NPROC_PER_NODE"] = "2"
    for e in mixed.values():
        e["WORLD_SIZE"] = "3"
    assert [f for f in check_env(mixed) if not f.ok] == []
    for e in mixed.values():
        e["WORLD_SIZE"] = "4"
    [bad] = [f for f in check_env(mixed) if not f.ok]
    assert "WORLD_SIZE=4 but the nodes' NPROC_PER_NODE add up to 2 + 1 = 3" in bad.message


def test_a_straggler_fixed_is_one_the_others_no_longer_wait_for():
    from labctl.diagnose.scenarios import SCENARIOS, symptom_remains

    straggler = SCENARIOS["straggler"]
    broken = ("straggler: rank 1 on node1 computes 1.7x the median rank's time per step; the others waited 2.31 s for "
              "it over 11 steps")
    noise = "straggler: rank 0 on node0 computes 1.2x the median rank's time per step; the others waited 0.21 s for it over 11 steps"
    still = "straggler: rank 1 on node1 computes 1.5x the median rank's time per step; the others waited 1.10 s for it over 11 steps"
    assert not symptom_remains(straggler, broken, "")
    assert not symptom_remains(straggler, broken, noise)  # two busy nodes differ, but nobody waits any more
    assert symptom_remains(straggler, broken, still)
    assert symptom_remains(SCENARIOS["package-drift"], "package drift: x", "package drift: x")  # any line counts there
