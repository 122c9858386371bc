"""`bench start`'s ways, as the argvs each round starts: the same no-op script every way, a fresh
rendezvous for every by-hand torchrun, and the static launch's ranks as a person would export them."""

from pathlib import Path

from labctl.bench import startup


def test_every_way_runs_the_same_script_and_by_hand_is_what_a_person_types():
    table = startup.ways(Path("/ws"), 2, "172.28.5.10", 29500, None)
    assert list(table)[0] == "labctl run (warm)" and not any(name.startswith("TorchX") for name in table)
    [warm] = table["labctl run (warm)"]()
    assert warm[-2:] == ["--", "/ws/.lab/bench-start/noop_ddp.py"]
    first, second = table["by hand: docker exec ... torchrun"](), table["by hand: docker exec ... torchrun"]()
    assert [argv[:3] for argv in first] == [["docker", "exec", "-e"]] * 2
    assert first[0][3] != second[0][3]  # a fresh PET_RDZV_ID each round
    static = table["by hand: docker exec ... python (static)"]()
    assert [argv[3] for argv in static] == ["RANK=0", "RANK=1"] and "MASTER_ADDR=172.28.5.10" in static[1]
    assert static[1][-3:] == ["bench-start-node1", "python", "/ws/.lab/bench-start/noop_ddp.py"]
    assert "TorchX local_docker (dist.ddp)" in startup.ways(Path("/ws"), 2, "172.28.5.10", 29500, "torchx")


def test_the_report_says_each_ways_median_against_the_warm_paths():
    report = startup.StartReport(3, 3, [startup.StartTiming("labctl run (warm)", (1.0, 1.2, 0.9)),
                                        startup.StartTiming("labctl run --launcher torchrun", (3.0, 2.7, 3.3))])
    assert report.warm_s == 1.0
    assert report.as_dict()["timings"][1] == {"way": "labctl run --launcher torchrun", "seconds": (3.0, 2.7, 3.3),
                                             "median_s": 3.0, "vs_warm": 3.0}
    assert startup.SCRIPTS.joinpath("noop_ddp.py").is_file() and startup.SCRIPTS.joinpath("train.py").is_file()
