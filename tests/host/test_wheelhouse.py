"""The real pip of every Python at hand, run with the arguments labctl gives it, against tiny real
wheels made for the test: the node's wheel picked whatever the host, and the wheelhouse resolved by
name as a fetch fills it (the arguments and the rest of the wheelhouse: tests/unit/test_wheelhouse.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_wheelhouse import ARM_NODE, NODE, make_wheel

from labctl.image.wheelhouse import (
    STAMP,
    Target,
    fill_wheelhouse,
    missing_wheels,
    pip_download_argv,
    resolve_wheelhouse,
    stamped_wheels,
)


def interpreters() -> list[str]:
    """This Python, and the other CPythons pyenv has (CI machines have 3.10, 3.12 and 3.13)."""
    found = [sys.executable]
    if shutil.which("pyenv"):
        versions = subprocess.run(["pyenv", "versions", "--bare"], capture_output=True, text=True).stdout.split()
        for version in versions:
            prefix = subprocess.run(["pyenv", "prefix", version], capture_output=True, text=True).stdout.strip()
            major_minor = ".".join(version.split(".")[:2])
            python = Path(prefix) / "bin" / f"python{major_minor}"
            if major_minor in ("3.10", "3.12", "3.13") and python.exists():
                found.append(str(python))
    return found


@pytest.mark.parametrize("python", interpreters())
def test_each_hosts_real_pip_picks_the_nodes_wheel(python, tmp_path):
    """pip itself, under every Python at hand, given our argv: the cp311 manylinux wheel for an
    x86_64 node, the aarch64 one for an arm engine, never the host's own."""
    index = tmp_path / "index"
    index.mkdir()
    for tag in ("cp311-cp311-manylinux_2_28_x86_64", "cp311-cp311-manylinux_2_28_aarch64",
                "cp312-cp312-manylinux_2_28_x86_64", "cp313-cp313-manylinux_2_28_x86_64",
                "cp313-cp313-macosx_11_0_arm64", "cp311-cp311-manylinux_2_39_x86_64"):
        make_wheel(index, f"demo-1.0-{tag}.whl", [])
    for target, expected in ((NODE, "demo-1.0-cp311-cp311-manylinux_2_28_x86_64.whl"),
                             (ARM_NODE, "demo-1.0-cp311-cp311-manylinux_2_28_aarch64.whl")):
        out = tmp_path / f"out-{target.machine}"
        argv = pip_download_argv(python, target, out, ["demo==1.0"], no_deps=True, no_index=True)
        argv.insert(argv.index("--find-links"), "--isolated")  # nothing from this machine's pip config
        argv += ["--find-links", str(index)]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert sorted(p.name for p in out.iterdir()) == [expected]


@pytest.fixture
def local_index(tmp_path, monkeypatch):
    """pip on a folder of tiny real wheels, nothing of this machine's pip configuration: `demo`
    needs `dep` everywhere, `old` below Python 3.12 and `new` from 3.12 on."""
    index = tmp_path / "index"
    index.mkdir()
    make_wheel(index, "demo-1.0-py3-none-any.whl", ["dep", "old; python_version < '3.12'",
                                                     "new; python_version >= '3.12'"])
    for name in ("dep", "old", "new"):
        make_wheel(index, f"{name}-1.0-py3-none-any.whl", [])
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    return index


def test_resolving_by_name_gives_what_a_fetch_gives_and_downloads_nothing(local_index, tmp_path):
    """The CUDA image's hash is made of its wheels' names: pip's --dry-run --report tells them
    without the GBs. For a 3.12 node from this host's 3.11 pip, the markers are the node's: `new`,
    which pip skips by the host's, is resolved in a second round, and `old` is left out."""
    node_312 = Target(python="3.12")
    lines = []
    resolved = resolve_wheelhouse(tmp_path / "resolved", ["demo"], node_312, lines.append)
    fetched = fill_wheelhouse(tmp_path / "fetched", ["demo"], node_312, lambda _m: None)
    assert resolved == fetched == ["demo-1.0-py3-none-any.whl", "dep-1.0-py3-none-any.whl", "new-1.0-py3-none-any.whl"]
    assert sorted(p.name for p in (tmp_path / "resolved").iterdir()) == [STAMP]  # no wheel, no pip report
    assert missing_wheels(tmp_path / "resolved", resolved) == resolved and "names only" in lines[0]
    assert "pip skipped new" in lines[1]  # the second round, by the node's markers
    assert stamped_wheels(tmp_path / "resolved", ["demo"], node_312) == resolved  # the next ask costs no pip


def test_where_pip_cannot_resolve_by_name_the_wheels_are_fetched_and_it_says_why(local_index, tmp_path):
    from labctl.image.image import resolve_cuda_wheels

    lines = []
    assert resolve_cuda_wheels(tmp_path / "w", ["ddplab-no-such-package"], NODE, lines.append) == []
    assert "could not resolve the wheels by name" in lines[-1] and "fetching them" in lines[-1]
    assert not (tmp_path / "w" / STAMP).exists()  # so the fetch starts afresh
