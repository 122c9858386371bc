"""Launcher plans: what each node runs, compared whole."""

import os
import re
from pathlib import Path

import pytest

from labctl.errors import ConfigError, LabError
from labctl.run.launch import (
    FORK_SOCKET,
    FORKSERVER_SCRIPT,
    WORKER_SCRIPT,
    Elastic,
    Launch,
    LaunchOptions,
    build_launches,
    choose_launcher,
    job_args,
    parse_script_args,
    store_launch,
    threads_per_process,
    torchrun_argv,
    workspace_script,
)

RUN_DIR = Path("/ws/.lab/demo/runs/r1")
NODE_ENV = {
    f"node{i}": {"MASTER_ADDR": "172.28.0.10", "MASTER_PORT": "29500", "NPROC_PER_NODE": "1"} for i in range(2)
}


def test_torchrun_plan():
    launches = build_launches(NODE_ENV, ["-m", "trainer", "--epochs", "2"], LaunchOptions(launcher="torchrun"),
                              run_id="r1", run_dir=RUN_DIR)
    common = {"DDPLAB_RUN_ID": "r1", "DDPLAB_RUN_DIR": str(RUN_DIR), "DDPLAB_LINKS_DIR": str(RUN_DIR.parent.parent / "links"), "PET_NNODES": "2", "PET_RDZV_ID": "r1",
              "PET_RDZV_CONF": "is_host=false"}
    warm = ["python", "-c", FORKSERVER_SCRIPT, "request", FORK_SOCKET, WORKER_SCRIPT, "--"]
    argv = [*warm, "-m", "torch.distributed.run", "--no-python", *warm, "-m", "trainer", "--epochs", "2"]
    assert launches == [Launch("node0", "node0", argv, common), Launch("node1", "node1", argv, common)]
    assert launches[0].torchrun and launches[0].display().endswith(
        "-- -m torch.distributed.run --no-python python -c <labctl/remote/forkserver.py> request "
        f"{FORK_SOCKET} <labctl/remote/worker.py> -- -m trainer --epochs 2")


def test_a_subset_of_nodes_runs_a_smaller_job_with_threads_shared_out():
    first = {"node0": NODE_ENV["node0"]}
    [launch] = build_launches(first, ["-m", "trainer"], LaunchOptions(launcher="torchrun"),
                              run_id="r1", run_dir=RUN_DIR, cpus=8)
    assert launch.env["PET_NNODES"] == "1" and launch.env["OMP_NUM_THREADS"] == "8"
    launches = build_launches(NODE_ENV, ["x.py"], LaunchOptions(launcher="static", nproc_per_node=2), run_id="r1",
                              run_dir=RUN_DIR, cpus=8)
    assert {l.env["OMP_NUM_THREADS"] for l in launches} == {"2"} and launches[0].env["WORLD_SIZE"] == "4"


@pytest.mark.parametrize("cpus, nodes, nproc, expected", [(2, 3, 1, 1), (16, 3, 1, 5), (16, 2, 2, 4), (1, 1, 1, 1)])
def test_threads_share_the_cpus_and_never_drop_to_zero(cpus, nodes, nproc, expected):
    assert threads_per_process(cpus, nodes, nproc) == expected


def test_torchrun_nproc_override_and_script_form():
    # torchrun's agent and its workers are forked by the node's fork server (cold where there is none);
    # the workers run through worker.py, which runs the script as python would and keeps its exit status
    warm = ["python", "-c", FORKSERVER_SCRIPT, "request", FORK_SOCKET, WORKER_SCRIPT, "--"]
    assert torchrun_argv(["train.py", "--lr", "0.1"], 4) == [*warm, "-m", "torch.distributed.run", "--nproc-per-node",
                                                             "4", "--no-python", *warm, "train.py", "--lr", "0.1"]
    assert torchrun_argv(["--module", "trainer"], None) == [*warm, "-m", "torch.distributed.run", "--no-python", *warm,
                                                            "--module", "trainer"]


def test_static_plan_ranks_and_environment():
    launches = build_launches(NODE_ENV, ["train.py"], LaunchOptions(launcher="static", nproc_per_node=2),
                              run_id="r1", run_dir=RUN_DIR)
    assert [(l.label, l.node, l.env["RANK"], l.env["LOCAL_RANK"]) for l in launches] == [
        ("node0/r0", "node0", "0", "0"), ("node0/r1", "node0", "1", "1"),
        ("node1/r2", "node1", "2", "0"), ("node1/r3", "node1", "3", "1"),
    ]
    for launch in launches:
        assert launch.argv == ["python", "-c", WORKER_SCRIPT, "train.py"]
        assert launch.env["WORLD_SIZE"] == "4" and launch.env["MASTER_ADDR"] == "172.28.0.10"
        assert launch.env["MASTER_PORT"] == "29500" and launch.env["DDPLAB_RUN_ID"] == "r1"


def test_static_plan_follows_each_nodes_own_process_count():
    # Real hosts may differ: a workstation with 2 processes, a laptop with 1.
    mixed = {"node0": {**NODE_ENV["node0"], "NPROC_PER_NODE": "2"}, "node1": NODE_ENV["node1"]}
    launches = build_launches(mixed, ["train.py"], LaunchOptions(launcher="static"), run_id="r1", run_dir=RUN_DIR)
    assert [(l.label, l.env["RANK"], l.env["LOCAL_RANK"], l.env["LOCAL_WORLD_SIZE"], l.env["GROUP_RANK"])
            for l in launches] == [("node0/r0", "0", "0", "2", "0"), ("node0/r1", "1", "1", "2", "0"),
                                   ("node1", "2", "0", "1", "1")]
    assert {l.env["WORLD_SIZE"] for l in launches} == {"3"}


def test_static_plan_defaults_to_the_env_files_nproc():
    launches = build_launches(NODE_ENV, ["train.py"], LaunchOptions(launcher="static"),
                              run_id="r1", run_dir=RUN_DIR)
    assert [l.label for l in launches] == ["node0", "node1"]


@pytest.mark.parametrize("args, expected", [
    (["train.py"], ["train.py"]),
    (["--", "train.py", "--x"], ["train.py", "--x"]),
    (["-m", "trainer", "--epochs", "1"], ["-m", "trainer", "--epochs", "1"]),
])
def test_parse_script_args(args, expected):
    assert parse_script_args(args) == expected


@pytest.mark.parametrize("args, fragment", [
    ([], "no training script"),
    (["-m"], "needs a module name"),
    (["-m", "--epochs"], "needs a module name"),
    (["--epochs", "3"], "expected the script"),
])
def test_parse_script_args_rejects(args, fragment):
    with pytest.raises(LabError, match=fragment):
        parse_script_args(args)


RUN_OPTIONS = {"--nproc-per-node", "--nproc_per_node", "--max-restarts", "--max_restarts", "-e", "--env"}


@pytest.mark.parametrize("args, message, hint", [
    # A labctl option after `--`: put it before `--` (the hint no longer says what the user just did).
    (["--max_restarts", "1", "train.py"], "--max_restarts is an option of `labctl run`, but it came after `--`",
     "put labctl run's options before `--`: labctl run --max_restarts ... -- SCRIPT"),
    (["--nproc-per-node=2", "train.py"], "--nproc-per-node is an option of `labctl run`", "before `--`"),
    # An option labctl does not have (typed before `--`, or after it): SCRIPT or -m MODULE comes first.
    (["--rdzv_backend", "c10d", "--", "train.py"], "got option '--rdzv_backend', and `labctl run` has no option "
     "--rdzv_backend", "SCRIPT or -m MODULE comes first, then its own options: labctl run -- train.py --lr 0.1; "
     "`labctl run --help` lists labctl's options"),
])
def test_an_option_where_the_script_belongs_gets_a_hint_that_fits(args, message, hint):
    with pytest.raises(LabError) as caught:
        parse_script_args(args, RUN_OPTIONS, "labctl run")
    assert message in caught.value.message and hint in caught.value.hint


def test_without_the_commands_options_the_hint_stays_general():
    with pytest.raises(LabError) as caught:
        parse_script_args(["--lr", "0.1"])
    assert "has no option" not in caught.value.message and "--help" not in caught.value.hint
    assert caught.value.hint.startswith("SCRIPT or -m MODULE comes first")


@pytest.mark.parametrize("argv, lab, expected", [
    (["docker", "compose", "-f", "/w/.lab/x/compose.yaml", "-p", "x", "up", "-d"], "x", True),
    (["/root/.docker/cli-plugins/docker-compose", "compose", "-f", "c.yaml", "-p", "x", "up"], "x", True),
    (["docker", "compose", "-f", "c.yaml", "-p", "xy", "up"], "x", False),
    (["docker", "compose", "-p", "x", "down"], "x", False),
    (["python", "-m", "labctl", "up", "-p", "x"], "x", False),
])
def test_is_compose_up_for(argv, lab, expected):
    from labctl.lab.lifecycle import is_compose_up_for

    assert is_compose_up_for(argv, lab) is expected


def test_elastic_runs_pass_torchruns_settings_and_a_fresh_worker_store():
    from labctl.run.launch import ELASTIC_RDZV_CONF, Elastic

    three = {f"node{i}": NODE_ENV["node0"] for i in range(3)}
    launches = build_launches(three, ["-m", "trainer"],
                              LaunchOptions(launcher="torchrun", elastic=Elastic(2, 2, 3), pg_timeout_s=30), run_id="r1",
                              run_dir=RUN_DIR)
    env = launches[0].env
    assert env["PET_NNODES"] == "2:3" and env["PET_MAX_RESTARTS"] == "2"
    assert env["PET_RDZV_CONF"] == "is_host=false," + ELASTIC_RDZV_CONF
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1" and env["DDPLAB_PG_TIMEOUT_S"] == "30"
    plain = build_launches(three, ["-m", "trainer"], LaunchOptions(launcher="torchrun"), run_id="r1",
                           run_dir=RUN_DIR)[0].env
    assert "PET_MAX_RESTARTS" not in plain and plain["PET_RDZV_CONF"] == "is_host=false"
    with pytest.raises(LabError, match="need torchrun"):
        build_launches(three, ["x.py"], LaunchOptions(launcher="static", nproc_per_node=1, elastic=Elastic(1)),
                       run_id="r1", run_dir=RUN_DIR)


@pytest.mark.parametrize("text, nodes, expected", [("2:3", 3, (2, 3)), ("3", 3, (3, 3)), ("1:2", 2, (1, 2))])
def test_nnodes_ranges(text, nodes, expected):
    from labctl.run.launch import parse_nnodes

    assert parse_nnodes(text, nodes) == expected


@pytest.mark.parametrize("text, message", [("2:4", "MAX must be the lab's node count, 3"), ("3:2", "1 <= MIN <= MAX"),
                                           ("a:b", "MIN:MAX"), ("0:3", "1 <= MIN")])
def test_bad_nnodes_are_refused(text, message):
    from labctl.errors import ConfigError
    from labctl.run.launch import parse_nnodes

    with pytest.raises(ConfigError, match=message):
        parse_nnodes(text, 3)


def test_partition_and_heal_commands():
    from labctl.net.faults import heal_commands, partition_commands

    assert [c.argv for c in partition_commands("eth0")] == [("ip", "link", "set", "dev", "eth0", "down")]
    assert [c.argv for c in heal_commands("eth0", "172.28.0.1")] == [
        ("ip", "link", "set", "dev", "eth0", "up"), ("ip", "route", "replace", "default", "via", "172.28.0.1", "dev", "eth0")]


@pytest.fixture
def ws(tmp_path):
    """A workspace with a script at its top and one in a subdirectory, and a folder beside it."""
    root = tmp_path / "ws"
    (root / "sub" / "deep").mkdir(parents=True)
    (root / "top.py").write_text("")
    (root / "sub" / "train.py").write_text("")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "x.py").write_text("")
    return root.resolve()


@pytest.mark.parametrize("cwd, args, expected", [
    ("", ["top.py", "--lr", "1"], ["top.py", "--lr", "1"]),             # from the workspace: as typed
    ("", ["./sub/train.py"], ["./sub/train.py"]),
    ("sub", ["train.py", "--out", "x.json"], ["sub/train.py", "--out", "x.json"]),  # its own args stay as given
    ("sub", ["../top.py"], ["top.py"]),
    ("sub/deep", ["../train.py"], ["sub/train.py"]),
    ("sub", ["not_yet.py"], ["sub/not_yet.py"]),                         # missing here: the nodes will say so
    ("sub", ["-m", "trainer", "x.py"], ["-m", "trainer", "x.py"]),       # a module is found by Python, not a path
    ("sub", ["/usr/lib/python3/x.py"], ["/usr/lib/python3/x.py"]),       # the node's own file
])
def test_a_script_is_taken_from_where_the_user_stands(ws, cwd, args, expected):
    assert workspace_script(args, ws / cwd, ws) == expected


def test_an_absolute_script_in_the_workspace_becomes_relative_for_hosts_with_another_path(ws):
    assert workspace_script([str(ws / "sub" / "train.py")], ws, ws) == ["sub/train.py"]


@pytest.mark.parametrize("script", ["../elsewhere/x.py", "../../outside.py", "link.py"])
def test_a_script_outside_the_workspace_is_refused(ws, script):
    (ws / "link.py").symlink_to(ws.parent / "elsewhere" / "x.py")  # the nodes could not follow it
    with pytest.raises(LabError, match="outside the workspace .*: the nodes see only the workspace") as caught:
        workspace_script([script], ws, ws)
    assert "move or copy the script into" in caught.value.hint


def test_job_args_checks_then_places_the_script(ws):
    assert job_args(("--", "train.py"), ws, ws / "sub") == ["sub/train.py"]
    assert job_args(("train.py",), ws) == ["train.py"]  # no cwd (the API's default): relative to the workspace
    with pytest.raises(LabError, match="no training script"):
        job_args((), ws, ws / "sub")


def test_the_warm_path_gives_each_rank_torchruns_worker_environment():
    launches = build_launches(NODE_ENV, ["train.py", "--lr", "1"], LaunchOptions(launcher="warm", nproc_per_node=2),
                              run_id="r1", run_dir=RUN_DIR)
    assert [l.label for l in launches] == ["node0/r0", "node0/r1", "node1/r2", "node1/r3"]
    assert launches[0].argv == ["python", "-c", FORKSERVER_SCRIPT, "request", FORK_SOCKET, WORKER_SCRIPT, "--",
                                "train.py", "--lr", "1"]
    env = launches[3].env
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE",
                                "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "ROLE_NAME")} == {
        "RANK": "3", "LOCAL_RANK": "1", "GROUP_RANK": "1", "ROLE_RANK": "3", "LOCAL_WORLD_SIZE": "2",
        "WORLD_SIZE": "4", "GROUP_WORLD_SIZE": "2", "ROLE_WORLD_SIZE": "4", "ROLE_NAME": "default"}
    # the run's own store on node0, joined as torchrun's workers join their agents' store
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["TORCHELASTIC_USE_AGENT_STORE"]) == ("172.28.0.10", "29500",
                                                                                             "True")
    assert (env["TORCHELASTIC_RUN_ID"], env["TORCHELASTIC_RESTART_COUNT"], env["PET_RDZV_ID"]) == ("r1", "0", "r1")
    assert launches[0].display().endswith(f"python -c <labctl/remote/forkserver.py> request {FORK_SOCKET} "
                                          "<labctl/remote/worker.py> -- train.py --lr 1")


def test_the_socket_is_named_by_the_programs_text_in_the_servers_folder():
    from labctl.remote import forkcommon, stop

    assert re.fullmatch(r"/tmp/ddplab/fork-[0-9a-f]{12}\.sock", FORK_SOCKET)
    assert os.path.dirname(FORK_SOCKET) == os.path.dirname(forkcommon.SOCKET_PATH)  # beside the registry stop reads
    assert stop.REGISTRY_DIR == os.path.join(os.path.dirname(FORK_SOCKET), forkcommon.REGISTRY)


def test_the_store_is_forked_too_on_the_warm_path():
    assert store_launch("node0", "29500", "r1", RUN_DIR).argv[:2] == ["python", "-c"]
    warm = store_launch("node0", "29500", "r1", RUN_DIR, warm=True)
    assert warm.argv[:5] == ["python", "-c", FORKSERVER_SCRIPT, "request", FORK_SOCKET] and warm.argv[-1] == "29500"


@pytest.mark.parametrize("asked, elastic, taken", [
    ("auto", Elastic(), "warm"), ("auto", Elastic(max_restarts=1), "torchrun"), ("auto", Elastic(0, 2, 3), "torchrun"),
    ("torchrun", Elastic(), "torchrun"), ("static", Elastic(), "static"), ("warm", Elastic(), "warm"),
])
def test_auto_takes_the_warm_path_unless_torchruns_agents_are_needed(asked, elastic, taken):
    launcher, why = choose_launcher(asked, elastic)
    assert launcher == taken and why


def test_warm_and_static_refuse_what_only_torchrun_does():
    with pytest.raises(LabError, match="need torchrun"):
        build_launches(NODE_ENV, ["x.py"], LaunchOptions(launcher="warm", elastic=Elastic(max_restarts=1)), run_id="r1",
                       run_dir=RUN_DIR)
    with pytest.raises(ConfigError, match="--launcher"):
        choose_launcher("mpirun", Elastic())


@pytest.mark.parametrize("setting, nodes, memory_gib, start", [
    ("auto", 3, 24, True), ("auto", 32, 24, True), ("auto", 64, 24, False), ("on", 64, 24, True),
    ("off", 3, 24, False), ("auto", 64, 0, True),  # an engine that does not say its memory: as asked
])
def test_fork_servers_start_where_they_fit_or_where_asked(setting, nodes, memory_gib, start):
    from labctl.run.warm import plan_servers

    started, note = plan_servers(setting, nodes, memory_gib * 1024**3)
    assert started == start
    assert (note is None) == start or setting == "off"
    if not start and setting == "auto":
        assert "64 of them would hold 14.4 GiB of the engine's 24.0 GiB" in note and "--warm on" in note
