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
    (["bench", "up", "--nodes-list", "3,0"], "each count must be from 1 to 64"),
    (["env", "--hosts", "", "--iface", "eth0"], "at least one"),
    (["shape"], "give exactly one of --bw, --clear or --show"),
    (["shape", "--bw", "1gbit", "--clear"], "got --bw, --clear"),
    (["shape", "--clear", "--delay", "5ms"], "go with --bw"),
    (["shape", "--bw", "100mbps"], "megaBYTES per second"),
    (["shape", "--bw", "1gbit", "--delay", "10"], "add a unit"),
    (["shape", "--bw", "1gbit", "--jitter", "1ms"], "needs --delay"),
    (["shape", "--bw", "1gbit", "--loss", "120"], "from 0 to 100"),
    (["up", "--bw", "fast"], "must be a rate"),
    (["bench", "allreduce", "--sizes", "8K:1K"], "smaller size"),
    (["cost", "--params", "lots", "--nodes", "2"], "parameter count"),
    (["cost", "--params", "1e9"], "--nodes"),
    (["cost", "--params", "1e9", "--nodes", "2", "--link", "10mbps"], "preset"),
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
    result = invoke("status")
    assert result.exit_code == 2
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
    # Bad values are usage errors (2); good ones reach the missing engine (also 2). Never a crash.
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_cost_calculator_json():
    import json

    result = invoke("cost", "--params", "760e6", "--dtype", "bf16", "--nodes", "2", "--link", "1GbE", "--link", "10GbE", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [r["link"] for r in rows] == ["1GbE", "10GbE"]
    assert abs(rows[0]["comm_s"] - 14.3) < 0.05 and abs(rows[1]["comm_s"] - 1.43) < 0.01


def test_cost_table_outside_a_lab_lists_every_preset():
    result = invoke("cost", "--params", "125M", "--nodes", "4", "--compute-s", "0.2", "--grad-accum", "4")
    assert result.exit_code == 0, result.output
    for name in ("1GbE", "2.5GbE", "10GbE", "100G-RoCE", "400G-RoCE", "NVLink"):
        assert name in result.output
    assert "comm/compute" in result.output
