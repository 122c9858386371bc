"""The wheelhouse is filled for the node's Python and platform, whatever Python runs labctl. The real
pip of every Python at hand, given these arguments, runs in tests/host/test_wheelhouse.py."""

from __future__ import annotations

import json
import zipfile
from dataclasses import asdict
from pathlib import Path

import pytest

from labctl.engine.detect import normalize_machine
from labctl.errors import CommandError, LabError
from labctl.image.wheelhouse import (
    STAMP,
    Target,
    Wheel,
    fill_wheelhouse,
    forget_wheelhouse,
    missing_wheels,
    pip_download_argv,
    prune_wheelhouse,
    read_wheel,
    stamped_wheels,
    target_from_probe,
    wheel_closure,
)

NODE = Target()  # CPython 3.11 on Debian bookworm, x86_64: the default node image
ARM_NODE = Target(machine="aarch64")

# The interpreters people run labctl with: the argv may name them, nothing else about them.
HOSTS = {
    "linux-3.11": "/usr/bin/python3.11",
    "ubuntu-24.04-3.12": "/home/me/ddplab/.venv/bin/python3.12",
    "fedora-3.13": "/usr/bin/python3.13",
    "macos-arm64-3.13": "/opt/homebrew/bin/python3.13",
}


def option_values(argv: list[str], option: str) -> list[str]:
    return [b for a, b in zip(argv, argv[1:]) if a == option]


@pytest.mark.parametrize("host", sorted(HOSTS))
@pytest.mark.parametrize("target, arch", [(NODE, "x86_64"), (ARM_NODE, "aarch64")])
def test_pip_is_told_the_nodes_interpreter_and_platform_whatever_the_host(host, target, arch, tmp_path):
    argv = pip_download_argv(HOSTS[host], target, tmp_path, ["torch==2.13.0", "numpy"])
    assert argv[:4] == [HOSTS[host], "-m", "pip", "download"]
    assert "--only-binary=:all:" in argv
    assert option_values(argv, "--python-version") == ["3.11"]
    assert option_values(argv, "--implementation") == ["cp"]
    assert option_values(argv, "--abi") == ["cp311"]
    platforms = option_values(argv, "--platform")
    assert f"manylinux_2_28_{arch}" in platforms and f"manylinux2014_{arch}" in platforms
    assert all(p.endswith(f"_{arch}") and p.startswith("manylinux") for p in platforms)
    assert argv[-2:] == ["torch==2.13.0", "numpy"]
    # Everything after the interpreter is the same from every host: the same wheels for the same node.
    others = {pip_download_argv(python, target, tmp_path, ["torch==2.13.0", "numpy"])[1:] == argv[1:]
              for python in HOSTS.values()}
    assert others == {True}


def test_platforms_are_every_manylinux_tag_the_nodes_glibc_runs():
    assert NODE.platforms()[0] == "manylinux_2_36_x86_64"  # Debian bookworm
    assert "manylinux_2_37_x86_64" not in NODE.platforms()  # a newer glibc's wheels would not load
    assert NODE.platforms()[-2:] == ["manylinux_2_17_x86_64", "manylinux2014_x86_64"]
    assert Target(glibc="2.31").platforms()[0] == "manylinux_2_31_x86_64"


def test_source_options(tmp_path):
    local = pip_download_argv("py", NODE, tmp_path, ["torch==2.13.0"], no_deps=True, no_index=True)
    assert "--no-deps" in local and "--no-index" in local and "--index-url" not in local
    index = pip_download_argv("py", NODE, tmp_path, ["torch==2.13.0"], no_deps=True, index_url="https://i/cpu")
    assert option_values(index, "--index-url") == ["https://i/cpu"] and "--no-index" not in index
    assert option_values(index, "-d") == option_values(index, "--find-links") == [str(tmp_path)]


@pytest.mark.parametrize("raw, expected", [("x86_64", "x86_64"), ("amd64", "x86_64"), ("aarch64", "aarch64"),
                                           ("arm64", "aarch64"), ("ARM64", "aarch64"), ("ppc64le", "ppc64le")])
def test_architecture_names(raw, expected):
    assert normalize_machine(raw) == expected


def test_target_from_the_base_images_own_python():
    probe = {"implementation": "cpython", "python": "3.11", "libc": "glibc", "glibc": "2.36", "machine": "arm64"}
    assert target_from_probe(probe) == Target(python="3.11", glibc="2.36", machine="aarch64")
    assert target_from_probe({**probe, "python": "3.12"}).abi == "cp312"
    with pytest.raises(LabError, match="'musl', not glibc"):
        target_from_probe({**probe, "libc": "musl", "glibc": ""})
    with pytest.raises(LabError, match="'pypy', not CPython"):
        target_from_probe({**probe, "implementation": "pypy"})


def wheel(name: str, version: str, *requires: str) -> Wheel:
    return Wheel(f"{name}-{version}-py3-none-any.whl", name, version, requires)


TORCH_LIKE = [
    wheel("torch", "2.13.0", "filelock", "sympy>=1.13.3", "setuptools; python_version >= '3.12'",
          "typing-extensions; python_version < '3.12'", "nvidia-nccl; platform_system == 'Linux'",
          "pywin32; sys_platform == 'win32'", "opt-einsum; extra == 'opt-einsum'"),
    wheel("filelock", "3.0"),
    wheel("sympy", "1.14.0", "mpmath<1.4,>=1.1.0"),
    wheel("mpmath", "1.3.0"),
    wheel("setuptools", "80.0"),  # what a 3.12 host's pip adds
]


def test_closure_follows_the_nodes_markers_not_the_hosts():
    needed, missing = wheel_closure(TORCH_LIKE, ["torch==2.13.0"], NODE)
    # setuptools is only for Python >= 3.12: a 3.12 host fetched it, the 3.11 node does not need it
    assert needed == {"torch-2.13.0-py3-none-any.whl", "filelock-3.0-py3-none-any.whl",
                      "sympy-1.14.0-py3-none-any.whl", "mpmath-1.3.0-py3-none-any.whl"}
    # and what a 3.12 (or macOS) host's pip skipped is asked for
    assert missing == ["nvidia-nccl", "typing-extensions"]
    needed_312, missing_312 = wheel_closure(TORCH_LIKE, ["torch==2.13.0"], Target(python="3.12"))
    assert "setuptools-80.0-py3-none-any.whl" in needed_312 and missing_312 == ["nvidia-nccl"]


def test_closure_checks_versions_and_follows_extras():
    wheels = [wheel("app", "1.0", "lib[fast]>=2"), wheel("lib", "2.1", "speedup; extra == 'fast'", "core"),
              wheel("core", "1.0"), wheel("speedup", "0.5")]
    needed, missing = wheel_closure(wheels, ["app"], NODE)
    assert len(needed) == 4 and missing == []
    needed, missing = wheel_closure(wheels, ["app", "core>=2"], NODE)
    assert missing == ["core>=2"]
    assert wheel_closure(wheels, ["lib"], NODE)[0] == {"lib-2.1-py3-none-any.whl", "core-1.0-py3-none-any.whl"}


def make_wheel(directory: Path, filename: str, requires: list[str]) -> Path:
    """A real (tiny) wheel file: what pip and read_wheel see of a package."""
    name, version = filename.split("-")[:2]
    path = directory / filename
    metadata = "\n".join(["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}",
                          *(f"Requires-Dist: {r}" for r in requires)]) + "\n"
    tag = "-".join(filename[:-4].split("-")[2:])
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name}-{version}.dist-info/METADATA", metadata)
        archive.writestr(f"{name}-{version}.dist-info/WHEEL", f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: {tag}\n")
        archive.writestr(f"{name}-{version}.dist-info/RECORD", "")
    return path


def test_read_wheel_takes_name_version_and_requirements_from_the_file(tmp_path):
    path = make_wheel(tmp_path, "Demo_Pkg-1.2-cp311-cp311-manylinux_2_28_x86_64.whl", ["numpy>=1", "x; python_version < '3.12'"])
    assert read_wheel(path) == Wheel(path.name, "demo-pkg", "1.2", ("numpy>=1", "x; python_version < '3.12'"))


def test_a_wheelhouse_with_cuda_packages_is_refused_for_the_cpu_image(tmp_path):
    """The node image is the CPU build: a torch that brought nvidia-* wheels came from the wrong index."""
    import json
    from dataclasses import asdict

    from labctl.image.image import ensure_wheelhouse, wheel_requirements
    from labctl.image.wheelhouse import STAMP
    from labctl.spec.labspec import LabSpec

    config = LabSpec()
    (tmp_path / STAMP).write_text(json.dumps({"requirements": wheel_requirements(config.torch_version),
                                              "target": asdict(NODE)}))
    for name in ("torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl",
                 "nvidia_nccl_cu12-2.27.3-py3-none-manylinux_2_18_x86_64.whl"):
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(LabError, match="CUDA packages .*nvidia_nccl_cu12.*not a CPU build"):
        ensure_wheelhouse(config, NODE, lambda _m: None, wheelhouse=tmp_path)


def test_a_pruned_wheelhouse_still_names_its_wheels_and_a_build_can_ask_for_them_again(tmp_path):
    """`build --lean` removes the wheel files; the image's hash is made of their names, which the stamp
    keeps, so an up-to-date check fetches nothing, and a build sees what is missing and starts over."""
    names = ["numpy-2.3.5-cp311-cp311-manylinux_2_27_x86_64.whl", "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"]
    requirements = ["torch==2.13.0", "numpy"]
    (tmp_path / STAMP).write_text(json.dumps({"requirements": requirements, "target": asdict(NODE), "wheels": names}))
    for name in names:
        (tmp_path / name).write_bytes(b"x" * 1000)

    def fill():  # would run pip, and fail in this empty folder, if it did not take the stamp's word
        return fill_wheelhouse(tmp_path, requirements, NODE, lambda _m: None, timeout_s=0.001)

    assert fill() == names and missing_wheels(tmp_path, names) == []
    assert prune_wheelhouse(tmp_path) == 2000 and prune_wheelhouse(tmp_path) == 0
    assert fill() == names
    assert missing_wheels(tmp_path, names) == names
    # What the build asks before it says it is about to download GBs: the stamp answers.
    assert stamped_wheels(tmp_path, requirements, NODE) == names
    assert stamped_wheels(tmp_path, ["torch==2.14.1", "numpy"], NODE) == [] == stamped_wheels(tmp_path, requirements,
                                                                                               ARM_NODE)
    forget_wheelhouse(tmp_path)
    assert not (tmp_path / STAMP).exists() and stamped_wheels(tmp_path, requirements, NODE) == []
    forget_wheelhouse(tmp_path)  # nothing to forget


def test_a_stamp_written_before_it_named_its_wheels_takes_the_files_names_and_keeps_them_when_pruned(tmp_path):
    wheel = "numpy-2.3.5-cp311-cp311-manylinux_2_27_x86_64.whl"
    (tmp_path / STAMP).write_text(json.dumps({"requirements": ["numpy"], "target": asdict(NODE)}))
    (tmp_path / wheel).write_bytes(b"x")

    def fill():  # pip would fail in this empty folder
        return fill_wheelhouse(tmp_path, ["numpy"], NODE, lambda _m: None, timeout_s=0.001)

    assert fill() == [wheel]
    assert prune_wheelhouse(tmp_path) == 1
    assert json.loads((tmp_path / STAMP).read_text())["wheels"] == [wheel]
    assert fill() == [wheel]


def test_an_old_stamp_whose_wheels_are_gone_fetches_them_again_and_nothing_is_pruned_without_a_stamp(tmp_path):
    (tmp_path / STAMP).write_text(json.dumps({"requirements": ["numpy"], "target": asdict(NODE)}))
    with pytest.raises(CommandError, match="(?s)pip download .*timed out"):  # the stamp names nothing to use: pip runs
        fill_wheelhouse(tmp_path, ["numpy"], NODE, lambda _m: None, timeout_s=0.001)
    (tmp_path / "stray-1.0-py3-none-any.whl").write_bytes(b"x")
    (tmp_path / STAMP).unlink(missing_ok=True)
    assert prune_wheelhouse(tmp_path) == 0 and (tmp_path / "stray-1.0-py3-none-any.whl").exists()
