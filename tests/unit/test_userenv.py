"""-e KEY=VALUE and --env-file FILE, as docker run takes them: parsed, checked, and on every process."""

from pathlib import Path

import pytest

from labctl.errors import ConfigError, LabError
from labctl.run.launch import LaunchOptions, build_launches
from labctl.run.userenv import build_user_env, check_user_env, parse_env_pair, parse_env_text, read_env_file

ENVIRON = {"HOME": "/home/me", "EMPTY": ""}


@pytest.mark.parametrize("text, expected", [
    ("NCCL_DEBUG=INFO", ("NCCL_DEBUG", "INFO")),
    ("A=", ("A", "")),                        # an empty value is a value
    ("A=b=c", ("A", "b=c")),                  # the first = splits
    ("_x1= spaces kept ", ("_x1", " spaces kept ")),
    ("HOME", ("HOME", "/home/me")),           # KEY alone: labctl's own environment, as docker does
    ("EMPTY", ("EMPTY", "")),
])
def test_an_env_pair(text, expected):
    assert parse_env_pair(text, ENVIRON) == expected


@pytest.mark.parametrize("text, fragment", [
    ("", "'' is not an environment variable name"),
    ("=x", "'' is not an environment variable name"),
    ("1A=2", "'1A' is not an environment variable name"),
    ("A-B=1", "'A-B' is not"),
    ("A\n=1", "is not an environment variable name"),
    ("ñ=1", "is not an environment variable name"),
    ("NOT_SET", "takes NOT_SET's value from labctl's environment, where NOT_SET is not set"),
])
def test_a_bad_env_pair_names_what_is_wrong(text, fragment):
    with pytest.raises(ConfigError, match="invalid -e=") as caught:
        parse_env_pair(text, ENVIRON)
    assert fragment in caught.value.message and caught.value.hint


def test_an_env_file_in_dotenv_syntax_without_expansion():
    text = '# a comment\nA=1\nexport B="two words"\nC=\'${A}\'\nD=${A}\n\nHOME\nE= # trailing comment\n'
    assert parse_env_text(text, ENVIRON, "run.env") == {"A": "1", "B": "two words", "C": "${A}", "D": "${A}",
                                                        "HOME": "/home/me", "E": ""}


@pytest.mark.parametrize("text, fragment", [
    ("A=1\nthis is not a line\n", "run.env, line 2: not a KEY=VALUE line: 'this is not a line'"),
    ("A-B=1\n", "run.env, line 1='A-B': is not an environment variable name"),
    ("A=1\nNOT_SET\n", "run.env, line 2: NOT_SET alone takes its value from labctl's environment"),
])
def test_a_bad_env_file_line_is_named(text, fragment):
    with pytest.raises(LabError) as caught:
        parse_env_text(text, ENVIRON, "run.env")
    assert fragment in caught.value.message


def test_a_missing_or_unreadable_env_file_names_the_path(tmp_path):
    with pytest.raises(ConfigError, match=f"invalid --env-file='{tmp_path}/nope.env': no such file"):
        read_env_file(tmp_path / "nope.env", {})
    with pytest.raises(ConfigError, match="is a folder, not a file"):
        read_env_file(tmp_path, {})
    with pytest.raises(ConfigError, match="could not be read"):
        read_env_file(Path("x" * 300), {})


def test_files_in_order_then_each_e_and_the_last_value_wins(tmp_path):
    (tmp_path / "a.env").write_text("A=from-a\nB=from-a\n")
    (tmp_path / "b.env").write_text("B=from-b\nC=from-b\n")
    env = build_user_env(["C=from-e", "HOME"], [tmp_path / "a.env", tmp_path / "b.env"], ENVIRON)
    assert env == {"A": "from-a", "B": "from-b", "C": "from-e", "HOME": "/home/me"}
    assert build_user_env([], [], ENVIRON) == {}


@pytest.mark.parametrize("key, hint", [
    ("RANK", "drop it"), ("WORLD_SIZE", "drop it"), ("MASTER_ADDR", "drop it"), ("DDPLAB_RUN_ID", "drop it"),
    ("PET_NPROC_PER_NODE", "--nproc_per_node for PET_NPROC_PER_NODE"), ("NPROC_PER_NODE", "--nproc_per_node"),
    ("PET_MAX_RESTARTS", "--max_restarts"), ("PET_RDZV_ENDPOINT", "drop it"),
    ("DDPLAB_PG_TIMEOUT_S", "--pg-timeout-s"),
])
def test_what_labctl_and_torchrun_set_for_the_run_is_refused(key, hint):
    with pytest.raises(LabError, match=f"cannot set {key}: labctl and torchrun set it for every process") as caught:
        check_user_env({key: "1"})
    assert hint in caught.value.hint
    with pytest.raises(LabError, match="cannot set RANK, PET_NNODES: labctl and torchrun set these"):
        build_user_env(["RANK=1", "PET_NNODES=3", "OK=1"], [], {})


def test_what_a_user_may_tune_is_let_through():
    env = {"OMP_NUM_THREADS": "4", "GLOO_SOCKET_IFNAME": "eth1", "NCCL_DEBUG": "INFO", "PYTHONPATH": "src",
           "TORCH_DISTRIBUTED_DEBUG": "DETAIL", "DDPLAB_OTHER": "x"}
    assert check_user_env(env) == env
    with pytest.raises(ConfigError, match="'A-B': is not an environment variable name"):
        check_user_env({"A-B": "1"})
    with pytest.raises(ConfigError, match="NUL byte"):
        check_user_env({"A": "x\x00y"})


NODE_ENV = {f"node{i}": {"MASTER_ADDR": "172.28.0.10", "MASTER_PORT": "29500", "NPROC_PER_NODE": "2"}
            for i in range(2)}


@pytest.mark.parametrize("launcher", ["torchrun", "static", "warm"])
def test_every_process_gets_the_users_env_over_labctls_own(launcher):
    options = LaunchOptions(launcher=launcher, env={"KEY": "v a l", "OMP_NUM_THREADS": "3"})
    launches = build_launches(NODE_ENV, ["x.py"], options, run_id="r1", run_dir="/ws/runs/r1", cpus=8)
    assert len(launches) == (2 if launcher == "torchrun" else 4)
    for launch in launches:
        assert launch.env["KEY"] == "v a l" and launch.env["OMP_NUM_THREADS"] == "3"  # the user's, not labctl's 2
        assert f"KEY='v a l' OMP_NUM_THREADS=3 {launch.argv[0]} " in launch.display()  # the user's go last
    with pytest.raises(LabError, match="cannot set LOCAL_RANK"):
        build_launches(NODE_ENV, ["x.py"], LaunchOptions(launcher=launcher, env={"LOCAL_RANK": "0"}), run_id="r1",
                       run_dir="/r")


def test_nccl_debug_adds_nccl_logging_under_what_the_user_gives():
    assert build_user_env([], [], {}, nccl_debug=True) == {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
    assert build_user_env(["NCCL_DEBUG=TRACE"], [], {}, nccl_debug=True)["NCCL_DEBUG"] == "TRACE"
    assert build_user_env([], [], {}) == {}
