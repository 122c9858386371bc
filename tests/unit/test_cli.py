"""The CLI in-process: bad input is exit status 2 with a specific message, before touching Docker."""

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from labctl.cli import main


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """No .env, no DDPLAB_* from the developer's shell, and no Docker engine to reach."""
    monkeypatch.chdir(tmp_path)
    for key in list(__import__("os").environ):
        if key.startswith("DDPLAB_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")


def invoke(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.mark.parametrize("args, fragment", [
    (["up", "--nodes", "0"], "invalid --nodes='0': must be from 1 to 64"),
    (["up", "--nodes", "500"], "invalid --nodes='500'"),
    (["up", "--subnet", "10.0.0.0/33"], "CIDR"),
    (["up", "--master-port", "22"], "from 1024 to 65535"),
    (["up", "--lab", "Bad Name"], "lowercase"),
    (["build", "--torch-version", "two"], "release such as"),
    # a name no file system can hold (a lone surrogate from undecodable argv bytes): a usage error, not a traceback
    (["hosts", "check", "--inventory", "\udd00"], "cannot read the inventory"),
    (["slurm", "export", "-o", "\udd00", "--", "-m", "trainer"], "cannot be a file name on this system"),
    (["k8s", "run", "\udd00"], "cannot be a file name on this system"),
    (["build", "--json"], "--json goes with --print-hash"),
    (["build", "--print-hash", "--force"], "builds nothing"),
    (["build", "--print-hash", "--mismatch-image"], "builds nothing"),
    (["bench", "up", "--nodes-list", "3,0"], "each count must be from 1 to 64"),
    (["env", "--hosts", "", "--iface", "eth0"], "at least one"),
    (["shape"], "give exactly one of a shape (--bw, --delay, --jitter, --loss), --clear or --show"),
    (["shape", "--bw", "1gbit", "--clear"], "got a shape (--bw) and --clear"),
    (["shape", "--clear", "--delay", "5ms"], "got a shape (--delay) and --clear"),
    (["shape", "--ingress"], "--ingress says where to shape, not what"),
    (["shape", "--clear", "--duration", "30s"], "--duration goes with a shape"),
    (["shape", "--delay", "5ms", "--duration", "forever"], "must be a duration such as 30s"),
    (["shape", "--jitter", "1ms"], "needs --delay"),
    (["shape", "--bw", "100mbps"], "megaBYTES per second"),
    (["shape", "--bw", "1gbit", "--delay", "10"], "add a unit"),
    (["shape", "--bw", "1gbit", "--jitter", "1ms"], "needs --delay"),
    (["shape", "--bw", "1gbit", "--loss", "120"], "from 0 to 100"),
    (["up", "--bw", "fast"], "must be a rate"),
    (["bench", "allreduce", "--sizes", "8K:1K"], "smaller size"),
    (["cost", "--params", "lots", "--nodes", "2"], "parameter count"),
    (["cost", "--params", "1e9"], "--nodes"),
    (["cost", "--params", "1e9", "--nodes", "2", "--link", "10mbps"], "preset"),
    (["cost", "--params", "1e9", "--nodes", "2", "--step"], "needs the compute of one micro-step"),
    (["cost", "--params", "1e9", "--nodes", "2", "--step", "--flops", "1e12"], "--tokens"),
    (["cost", "--params", "1e9", "--nodes", "2", "--tokens", "8"], "needs --step"),
    (["cost", "--nodes", "2"], "--params=None: is needed: the model's parameter count"),
    (["cost", "--from-run", "r1", "--params", "1e9"], "--params='1e9': describes the model or its step, which --from-run takes"),
    (["cost", "--from-run", "r1", "--strategy", "fsdp"], "--strategy='fsdp': describes the model"),
    (["cost", "--params", "1e9", "--nodes", "2", "--step", "--compute-s", "1", "--flops", "1e12"], "give one"),
    (["slow", "node2"], "exactly one of --cpus C or --clear"),
    (["slow", "node2", "--cpus", "1", "--clear"], "exactly one of --cpus C or --clear"),
    (["slow", "node2", "--cpus", "lots"], "number of CPUs"),
])
def test_bad_input_exit_2(args, fragment):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert fragment in result.output


def test_bad_dotenv_value_names_file(tmp_path):
    (tmp_path / ".env").write_text("DDPLAB_NODES=lots\n")
    result = invoke("up")
    assert result.exit_code == 2
    assert "DDPLAB_NODES='lots'" in result.output and ".env" in result.output


def test_no_engine_is_a_clear_error():
    """A machine in the wrong state, not bad input: exit status 1, with the engine it tried."""
    result = invoke("status")
    assert result.exit_code == 1
    assert "no Docker engine answers at unix:///nonexistent/docker.sock" in result.output
    assert "make engine" in result.output


def test_env_writes_files_and_prints_commands(tmp_path):
    result = invoke("env", "--hosts", "100.64.0.1,100.64.0.2", "--iface", "tailscale0", "--out", "hosts")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "hosts" / "node1.env").read_text().count("PET_RDZV_CONF=is_host=false") == 1
    assert "node0 (100.64.0.1):  set -a; . hosts/node0.env; set +a; torchrun -m trainer" in result.output


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=12), max_size=4))
def test_fuzz_up_flags_never_traceback(values):
    flags = ["--nodes", "--subnet", "--master-port", "--cpus"]
    args = ["up"]
    for flag, value in zip(flags, values):
        args += [flag, value]
    result = CliRunner().invoke(main, args)
    # Bad values are usage errors (2); good ones reach the missing engine (1, a state). Never a crash.
    assert result.exit_code == 2 or (result.exit_code == 1 and "no Docker engine answers" in result.output), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_cost_calculator_json():
    import json

    result = invoke("cost", "--params", "760e6", "--dtype", "bf16", "--nodes", "2", "--link", "1GbE", "--link", "10GbE", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [r["link"] for r in rows] == ["1GbE", "10GbE"]
    assert abs(rows[0]["comm_s"] - 14.3) < 0.05 and abs(rows[1]["comm_s"] - 1.43) < 0.01


def test_cost_step_reproduces_the_classic_table_with_its_terms():
    import json

    result = invoke("cost", "--params", "760e6", "--nodes", "2", "--link", "1GbE", "--link", "10GbE",
                    "--link", "400G-RoCE", "--step", "--compute-s", "0.5", "--json")
    assert result.exit_code == 0, result.output
    rows = {r["link"]: r for r in json.loads(result.output)}
    # the all-reduce of 760M bf16 gradients on 2 nodes at 85% of the link: about 14 s, 1.4 s, 36 ms
    assert [round(rows[name]["comm_s"], 2) for name in ("1GbE", "10GbE")] == [14.31, 1.43]
    assert abs(rows["400G-RoCE"]["comm_s"] - 0.036) < 0.001
    for row in rows.values():  # backward (a third of a second) hides what it can
        assert row["predicted_step_s"] == pytest.approx(row["compute_s"] + row["exposed_comm_s"] + row["optimizer_s"])
        assert row["comm_s"] - 1 / 3 - 1e-9 <= row["exposed_comm_s"] <= row["comm_s"]
    table = invoke("cost", "--params", "760e6", "--nodes", "2", "--link", "1GbE", "--step", "--flops", "400e12",
                   "--tokens", "8192")
    assert table.exit_code == 0 and "predicted" in table.output and "6 x 7.6e+08 params" in table.output, table.output


def test_cost_table_outside_a_lab_lists_every_preset():
    result = invoke("cost", "--params", "125M", "--nodes", "4", "--compute-s", "0.2", "--grad-accum", "4")
    assert result.exit_code == 0, result.output
    for name in ("1GbE", "2.5GbE", "10GbE", "100G-RoCE", "400G-RoCE", "NVLink"):
        assert name in result.output
    assert "comm/compute" in result.output


INVENTORY = """
name = "pair"
[defaults]
iface = "eth0"
user = "me"
python = "/opt/venv/bin/python"
[[hosts]]
address = "10.1.0.1"
nproc_per_node = 2
[[hosts]]
address = "10.1.0.2"
"""


def test_hosts_without_the_labs_inventory_is_the_labs_state_exit_1(tmp_path):
    result = invoke("hosts", "check")  # no `labctl up --ssh` wrote .lab/ddplab/hosts.toml
    assert result.exit_code == 1 and "no inventory at " in result.output, result.output


@pytest.mark.parametrize("args, fragment", [
    (["hosts", "run", "--inventory", "nope.toml", "--", "x.py"], "no inventory at nope.toml"),
    (["hosts", "run", "--inventory", "hosts.toml"], "no training script given"),
    (["hosts", "run", "--inventory", "hosts.toml", "--nproc-per-node", "0", "--", "x.py"],
     "invalid --nproc-per-node='0'"),
    (["hosts", "run", "--inventory", "hosts.toml", "--timeout-s", "-1", "--", "x.py"], "positive number of seconds"),
    (["hosts", "sync", "--inventory", "bad.toml"], "hosts[0].port='x'"),
])
def test_hosts_bad_input_exit_2(tmp_path, args, fragment):
    (tmp_path / "hosts.toml").write_text(INVENTORY)
    (tmp_path / "bad.toml").write_text('[[hosts]]\naddress = "10.0.0.1"\niface = "eth0"\nport = "x"\n')
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert fragment in result.output


def test_hosts_run_dry_run_shows_each_hosts_command_and_connects_to_nothing(tmp_path):
    (tmp_path / "hosts.toml").write_text(INVENTORY)
    result = invoke("hosts", "run", "--inventory", "hosts.toml", "--dry-run", "--launcher", "torchrun", "--",
                    "-m", "trainer", "--epochs", "1")
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if "torch.distributed.run" in line]
    assert [line.split(" (")[0] for line in lines] == ["node0", "node1"]
    assert "(me@10.1.0.1:22)" in lines[0] and "PET_RDZV_CONF=is_host=false" in lines[0]
    assert "DDPLAB_RUN_DIR=.lab/pair/runs/" in lines[0]
    # The first host runs two processes, the second one: three ranks in all, one process each.
    for launcher in ("static", "warm"):
        each = invoke("hosts", "run", "--inventory", "hosts.toml", "--dry-run", "--launcher", launcher, "--", "x.py")
        header, *ranks = each.output.splitlines()
        assert header == f"# launcher: {launcher} (--launcher {launcher})"
        assert [line.split(" (")[0] for line in ranks] == ["node0/r0", "node0/r1", "node1"]
        assert "WORLD_SIZE=3" in each.output


def test_hosts_sync_dry_run_prints_rsync_with_strict_host_keys(tmp_path):
    (tmp_path / "hosts.toml").write_text(INVENTORY)
    result = invoke("hosts", "sync", "--inventory", "hosts.toml", "--dry-run", "--exclude", "*.ckpt")
    assert result.exit_code == 0, result.output
    assert "node1: rsync --archive --delete" in result.output and "'--exclude=*.ckpt'" in result.output
    assert "StrictHostKeyChecking=yes" in result.output and "10.1.0.2:ddplab-workspace/" in result.output
    assert not (tmp_path / ".lab").exists()


def test_torchruns_underscore_spellings_work_and_help_shows_labctls(tmp_path):
    (tmp_path / "hosts.toml").write_text(INVENTORY)
    result = invoke("hosts", "run", "--inventory", "hosts.toml", "--dry-run", "--launcher", "torchrun",
                    "--nproc_per_node", "3", "--", "x.py")
    assert result.exit_code == 0, result.output
    assert "-m torch.distributed.run --nproc-per-node 3 --no-python python -c" in result.output
    # Accepted by `run` too: it gets as far as the missing engine, a state, not bad input.
    result = invoke("run", "--nproc_per_node", "2", "--max_restarts", "1", "--dry-run", "--", "x.py")
    assert result.exit_code == 1 and "no Docker engine answers" in result.output, result.output
    result = invoke("env", "--hosts", "10.0.0.1,10.0.0.2", "--iface", "eth0", "--nproc_per_node", "2",
                    "--master_port", "29600", "--rdzv_id", "job7", "--out", "hosts")
    written = (tmp_path / "hosts" / "node1.env").read_text()
    assert result.exit_code == 0 and "PET_NPROC_PER_NODE=2" in written and "MASTER_PORT=29600" in written
    assert "PET_RDZV_ID=job7" in written
    for command in (["run"], ["hosts", "run"], ["up"], ["env"]):
        options = invoke(*command, "--help").output.split("Options:")[1]
        assert "--nproc-per-node" in options and not any(
            name in options for name in ("--nproc_per_node", "--max_restarts", "--master_port", "--rdzv_id"))


@pytest.mark.parametrize("args, message, hint", [
    (["run", "--", "--max-restarts", "1", "x.py"], "--max-restarts is an option of `labctl run`, but it came after `--`",
     "put labctl run's options before `--`"),
    (["hosts", "run", "--inventory", "hosts.toml", "--rdzv-backend", "c10d", "--", "x.py"],
     "`labctl hosts run` has no option --rdzv-backend", "SCRIPT or -m MODULE comes first"),
])
def test_an_option_in_the_scripts_place_is_exit_2_with_the_right_hint(tmp_path, args, message, hint):
    (tmp_path / "hosts.toml").write_text(INVENTORY)
    result = invoke(*args)
    assert result.exit_code == 2 and message in result.output and hint in result.output, result.output


def test_hosts_run_dry_run_shows_the_users_env_on_every_process(tmp_path, monkeypatch):
    (tmp_path / "hosts.toml").write_text(INVENTORY)
    (tmp_path / "run.env").write_text("# tuning\nNCCL_DEBUG=WARN\nexport MSG='hello world'\n")
    monkeypatch.setenv("FROM_SHELL", "yes")
    result = invoke("hosts", "run", "--inventory", "hosts.toml", "--dry-run", "--launcher", "static",
                    "--env-file", "run.env", "-e", "NCCL_DEBUG=INFO", "--env", "FROM_SHELL", "--", "x.py")
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if not line.startswith("# launcher: static")]
    assert len(lines) == 3 and all("NCCL_DEBUG=INFO MSG='hello world' FROM_SHELL=yes python -c "
                                   "<labctl/remote/worker.py> x.py" in line for line in lines), result.output


def test_hosts_run_nccl_debug_sets_nccl_logging_on_every_process(tmp_path):
    (tmp_path / "hosts.toml").write_text(INVENTORY)
    result = invoke("hosts", "run", "--inventory", "hosts.toml", "--dry-run", "--launcher", "static", "--nccl-debug",
                    "--", "x.py")
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if not line.startswith("# launcher: static")]
    assert lines and all("NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET python -c <labctl/remote/worker.py> x.py" in line
                         for line in lines), result.output


@pytest.mark.parametrize("args, fragment", [
    (["-e", "1X=1"], "invalid -e='1X=1': must be KEY=VALUE or KEY"),
    (["-e", "UNSET_HERE_1"], "where UNSET_HERE_1 is not set"),
    (["-e", "RANK=3"], "cannot set RANK"),
    (["-e", "PET_MAX_RESTARTS=3"], "cannot set PET_MAX_RESTARTS"),
    (["--env-file", "nope.env"], "invalid --env-file='nope.env': no such file"),
])
def test_bad_env_options_are_exit_2_before_any_host_or_engine(tmp_path, args, fragment):
    (tmp_path / "hosts.toml").write_text(INVENTORY)
    for command in (["run"], ["hosts", "run", "--inventory", "hosts.toml"]):
        result = invoke(*command, *args, "--", "x.py")
        assert result.exit_code == 2 and fragment in result.output, result.output


def test_from_a_subdirectory_the_workspace_is_found_and_the_script_taken_from_there(tmp_path, monkeypatch):
    (tmp_path / ".lab").mkdir()
    (tmp_path / "hosts.toml").write_text(INVENTORY)
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    result = invoke("hosts", "run", "--inventory", "../hosts.toml", "--dry-run", "--", "train.py", "--lr", "1")
    launcher, *lines = result.output.splitlines()
    assert result.exit_code == 0 and launcher.startswith("# launcher: warm (") and len(lines) == 3, result.output
    # The run folder is the workspace's, and each host runs sub/train.py from its copy of the workspace.
    assert all(line.endswith("<labctl/remote/worker.py> -- sub/train.py --lr 1") and "DDPLAB_RUN_DIR=.lab/pair/runs/"
               in line for line in lines), result.output
    outside = invoke("hosts", "run", "--inventory", "../hosts.toml", "--dry-run", "--", "../../x.py")
    assert outside.exit_code == 2 and "outside the workspace" in outside.output


def test_ups_help_says_each_settings_default_as_the_lab_spec_has_it():
    """The defaults in `up --help` are read off LabSpec's fields: they cannot drift from what up does."""
    from labctl.cli.lab import up
    from labctl.cli.options import spec_default
    from labctl.spec.labspec import SETTINGS

    in_words = {"ssh", "cuda", "image", "overlay"}  # a value would not say it: "as the running lab is", "the GPU nodes", ...
    checked = 0
    for param in up.params:
        if param.name not in SETTINGS or not param.help or "; default" not in param.help:
            continue
        key = SETTINGS[param.name][0]
        assert f"[env {key}; default " in param.help, param.help
        if param.name not in in_words:
            assert f"[env {key}; default {spec_default(param.name)}" in param.help, param.help
        checked += 1
    assert checked >= 14


@pytest.mark.parametrize("result_json, fragment", [
    (None, "has no result.json (it is still running"),
    ("[1, 2]", "has no result.json (it is still running"),
    ('{"summary": {"workload": "mine"}}', "has no step model to price: only the trainer's runs"),
    ('{"summary": {"step_model": {"inputs": {"job": {}}}}}', "step model inputs are not as this labctl writes them"),
])
def test_cost_from_a_run_that_cannot_be_priced_says_why_and_exits_1(tmp_path, result_json, fragment):
    """A run folder that is not a finished trainer run's (a lab in the wrong state for it): exit 1."""
    run = tmp_path / "runs" / "20261207-000000-abcd"
    run.mkdir(parents=True)
    if result_json is not None:
        (run / "result.json").write_text(result_json)
    result = invoke("cost", "--from-run", str(run))
    assert result.exit_code == 1 and fragment in result.output, result.output
