"""Configuration: precedence, parsing tables, and fuzzing of the parsers."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from labctl.errors import ConfigError
from labctl.spec.addresses import check_fits, node_ip, overlaps, pick_free_subnet, subnet_capacity
from labctl.spec.labspec import (
    AUTO,
    LabSpec,
    load_config,
    resolve_config,
)


def test_defaults():
    config = resolve_config()
    assert config == LabSpec()
    assert (config.lab, config.nodes, config.subnet, config.master_port) == ("ddplab", 3, AUTO, 29500)
    assert config.image_tag == "ddplab-node:torch2.13.0-cpu"
    assert all(source == "default" for source in config.sources.values())


def test_precedence_defaults_dotenv_environment_flags():
    dotenv = {"DDPLAB_NODES": "4", "DDPLAB_LAB": "fromdotenv", "DDPLAB_MASTER_PORT": "29600"}
    environ = {"DDPLAB_NODES": "5", "DDPLAB_LAB": "fromenv"}
    flags = {"nodes": "6"}
    config = resolve_config(dotenv=dotenv, environ=environ, flags=flags)
    assert config.nodes == 6 and config.sources["nodes"] == "flag"
    assert config.lab == "fromenv" and config.sources["lab"] == "environment"
    assert config.master_port == 29600 and config.sources["master_port"] == ".env"
    assert config.nproc_per_node == 1 and config.sources["nproc_per_node"] == "default"


def test_load_config_reads_dotenv_file(tmp_path):
    (tmp_path / ".env").write_text("# comment\nDDPLAB_NODES=7\nDDPLAB_CPUS=\n")
    config = load_config(tmp_path, {}, {})
    assert config.nodes == 7 and config.cpus is None
    assert config.sources["nodes"] == str(tmp_path / ".env")


def test_env_example_lists_every_setting_and_parses():
    from pathlib import Path

    from dotenv import dotenv_values

    from labctl.spec.labspec import SETTINGS

    example = Path(__file__).resolve().parents[2] / ".env.example"
    values = dotenv_values(example)
    assert sorted(values) == sorted(key for key, _ in SETTINGS.values())
    text = example.read_text().splitlines()
    for key, _ in SETTINGS.values():  # each knob has a one-line comment right above it
        index = next(i for i, line in enumerate(text) if line.startswith(f"{key}="))
        assert text[index - 1].startswith("# "), key
    assert resolve_config(dotenv=values) == LabSpec(memory="4g")


@pytest.mark.parametrize("key, value, expected", [
    ("DDPLAB_NODES", "1", ("nodes", 1)),
    ("DDPLAB_NODES", " 64 ", ("nodes", 64)),
    ("DDPLAB_SUBNET", "10.99.0.0/24", ("subnet", "10.99.0.0/24")),
    ("DDPLAB_SUBNET", "AUTO", ("subnet", AUTO)),
    ("DDPLAB_CPUS", "0.5", ("cpus", 0.5)),
    ("DDPLAB_CPUS", "", ("cpus", None)),
    ("DDPLAB_MEMORY", "2G", ("memory", "2g")),
    ("DDPLAB_MEMORY", "none", ("memory", None)),
    ("DDPLAB_MASTER_PORT", "1024", ("master_port", 1024)),
    ("DDPLAB_LAB", "ci-lab_2", ("lab", "ci-lab_2")),
    ("DDPLAB_BW", "1000mbit", ("bw", "1gbit")),
    ("DDPLAB_BW", "", ("bw", None)),
    ("DDPLAB_NODE_CPUS", "node2=0.25, node0=1", ("node_cpus", (("node0", 1.0), ("node2", 0.25)))),
    ("DDPLAB_NODE_CPUS", "", ("node_cpus", ())),
    ("DDPLAB_SSH", "1", ("ssh", True)),
    ("DDPLAB_SSH", "off", ("ssh", False)),
    ("DDPLAB_SSH", "", ("ssh", None)),
    ("DDPLAB_CPU_KERNELS", "NATIVE", ("cpu_kernels", "native")),
])
def test_good_values(key, value, expected):
    field, parsed = expected
    assert getattr(resolve_config(environ={key: value}), field) == parsed


@pytest.mark.parametrize("key, value, fragment", [
    ("DDPLAB_NODES", "0", "from 1 to 64"),
    ("DDPLAB_NODES", "500", "from 1 to 64"),
    ("DDPLAB_NODES", "three", "whole number"),
    ("DDPLAB_NPROC_PER_NODE", "0", "from 1 to 32"),
    ("DDPLAB_SUBNET", "10.0.0.5/24", "did you mean 10.0.0.0/24"),
    ("DDPLAB_SUBNET", "300.1.1.0/24", "CIDR"),
    ("DDPLAB_SUBNET", "fd00::/64", "IPv4"),
    ("DDPLAB_SUBNET", "10.0.0.0/30", "/28 or larger"),
    ("DDPLAB_SUBNET", "127.0.0.0/24", "not loopback"),
    ("DDPLAB_MASTER_PORT", "80", "from 1024 to 65535"),
    ("DDPLAB_MASTER_PORT", "70000", "from 1024 to 65535"),
    ("DDPLAB_TORCH_VERSION", "latest", "release such as"),
    ("DDPLAB_CPUS", "-1", "from 0.01"),
    ("DDPLAB_CPUS", "lots", "number of CPUs"),
    ("DDPLAB_MEMORY", "64m", "at least 256m"),
    ("DDPLAB_MEMORY", "4 GB", "size such as"),
    ("DDPLAB_LAB", "My Lab", "lowercase"),
    ("DDPLAB_IFACE", "an-interface-name-too-long", "interface name"),
    ("DDPLAB_BW", "100mbps", "BYTES per second"),
    ("DDPLAB_BW", "100", "rate such as"),
    ("DDPLAB_NODE_CPUS", "node2", "NODE=CPUS pairs"),
    ("DDPLAB_NODE_CPUS", "node2=0", "give a CPU count"),
    ("DDPLAB_NODE_CPUS", "node1=1,node1=2", "names node1 twice"),
    ("DDPLAB_SSH", "maybe", "true or false"),
    ("DDPLAB_CPU_KERNELS", "avx512", "one of avx2, native"),
])
def test_bad_values_name_key_value_and_rule(key, value, fragment):
    with pytest.raises(ConfigError) as info:
        resolve_config(environ={key: value})
    message = str(info.value)
    assert key in message and repr(value) in message and fragment in message


def test_bad_flag_is_reported_as_the_flag():
    with pytest.raises(ConfigError, match=r"--nodes='0'"):
        resolve_config(flags={"nodes": "0"})


def test_bad_dotenv_value_names_the_file():
    with pytest.raises(ConfigError, match=r"from /x/.env"):
        resolve_config(dotenv={"DDPLAB_NODES": "x"}, dotenv_name="/x/.env")


def test_node_ips_and_capacity():
    assert node_ip("172.28.3.0/24", 0) == "172.28.3.10"
    assert node_ip("172.28.3.0/24", 15) == "172.28.3.25"
    assert subnet_capacity("172.28.3.0/24") == 245
    assert subnet_capacity("10.0.0.0/28") == 5
    with pytest.raises(ConfigError, match="at most 5 nodes"):
        check_fits(LabSpec(nodes=6), "10.0.0.0/28")


def test_pick_free_subnet_avoids_used_ranges():
    assert pick_free_subnet([]) == "172.28.0.0/24"
    assert pick_free_subnet(["172.17.0.0/16", "172.28.0.0/24", "172.28.1.0/25"]) == "172.28.2.0/24"
    assert pick_free_subnet(["172.28.0.0/16"]) == "172.29.0.0/24"
    assert overlaps("172.28.0.0/24", ["fd00::/64", "172.28.0.128/25"]) == ["172.28.0.128/25"]


@given(st.text(max_size=40))
def test_fuzz_parsers_raise_only_config_errors(raw):
    for key in ("DDPLAB_NODES", "DDPLAB_SUBNET", "DDPLAB_MASTER_PORT", "DDPLAB_CPUS", "DDPLAB_MEMORY", "DDPLAB_LAB",
                "DDPLAB_BW", "DDPLAB_NODE_CPUS", "DDPLAB_SSH"):
        try:
            resolve_config(environ={key: raw})
        except ConfigError as exc:
            assert key in str(exc)


@given(st.integers(min_value=-10**6, max_value=10**6))
def test_fuzz_node_counts(n):
    if 1 <= n <= 64:
        assert resolve_config(flags={"nodes": str(n)}).nodes == n
    else:
        with pytest.raises(ConfigError, match="from 1 to 64"):
            resolve_config(flags={"nodes": str(n)})


def test_parse_node_cpus():
    from labctl.spec.labspec import checked_node_cpus

    assert checked_node_cpus("node2=0.25", 3) == {"node2": 0.25}
    assert checked_node_cpus(" node0=1 , node2=0.5 ", 3) == {"node0": 1.0, "node2": 0.5}
    for bad, fragment in (("node3=1", "node0..node2"), ("node2", "NODE=CPUS"), ("n2=1", "NODE=CPUS"),
                          ("node2=fast", "number of CPUs"), ("node2=0", "CPU count"), ("node1=1,node1=2", "twice"),
                          ("", "at least one")):
        with pytest.raises(ConfigError, match=fragment):
            checked_node_cpus(bad, 3)
