"""The project's packages as data (labctl.image.packages): declarations, the lab's lock (PEP 751),
what pip's refusals mean, and what a node image still needs. pip's own words are real: captured from
pip 26 into tests/unit/pip/ (the commands that made them are in each test)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from labctl.errors import ConfigError, LabError, StateError
from labctl.image.lockfile import (
    Lock,
    Pin,
    describe_lock_file,
    hash_requirements,
    lock_from_report,
    parse_lock,
    read_lab_lock,
    render_lock,
    to_install,
)
from labctl.image.packages import (
    Declaration,
    base_of,
    check_torch,
    inputs_digest,
    package_tag,
    pyproject_requirements,
    read_declaration,
)
from labctl.image.piperrors import explain_pip_failure
from labctl.image.wheelhouse import Target
from labctl.spec.labspec import resolve_config, setting_text
from labctl.spec.parsers import parse_modules, parse_requirement_list, parse_requirements_file

PIP = Path(__file__).resolve().parent / "pip"
TARGET = Target()  # CPython 3.11, glibc 2.36, x86_64: the node image's
SHA = "a" * 64


def pin(name: str, version: str, sha: str = SHA) -> Pin:
    return Pin(name, version, f"{name}-{version}-py3-none-any.whl", f"https://files.example/{name}-{version}.whl", sha)


LOCK = Lock((pin("torch", "2.13.0+cpu"), pin("tqdm", "4.67.1", "b" * 64), pin("numpy", "2.4.6", "c" * 64)),
            "inputs123", ("requirements.txt",), "2.13.0", TARGET.describe())


# ------------------------------------------------------------------------------------- settings


@pytest.mark.parametrize("raw, expected", [
    ("tqdm", ("tqdm",)),
    ("tqdm einops==0.8.1", ("tqdm", "einops==0.8.1")),
    ("tqdm\nfoo>=1,<2", ("tqdm", "foo<2,>=1")),  # one per line: a requirement may hold commas (and blanks)
    ("tqdm tqdm", ("tqdm",)),
    ("", ()),
])
def test_with_takes_requirements_one_per_line_or_blank_separated(raw, expected):
    assert parse_requirement_list(raw) == expected


@pytest.mark.parametrize("raw, says", [("foo==", "is not a requirement"), ("foo @ https://x/y.whl", "names a URL")])
def test_with_refuses_what_is_not_a_released_requirement(raw, says):
    with pytest.raises(ValueError, match=says):
        parse_requirement_list(raw if "@" not in raw else raw + "\n")


def test_the_settings_parse_as_the_cli_gives_them():
    config = resolve_config(flags={"with_packages": ("tqdm", "foo>=1,<2"), "preload": ("lightning", "yaml"),
                                   "requirements": "none"})
    assert config.with_packages == ("tqdm", "foo<2,>=1") and config.preload == ("lightning", "yaml")
    assert config.requirements == "" and config.sources["requirements"] == "flag"  # given: a lab's packages go
    assert setting_text("with_packages", ["a>=1,<2", "b"]) == "a>=1,<2\nb"
    env = resolve_config(environ={"DDPLAB_WITH": "tqdm einops", "DDPLAB_PRELOAD": "lightning, yaml"})
    assert env.with_packages == ("tqdm", "einops") and env.preload == ("lightning", "yaml")


def test_bad_settings_name_the_key_and_the_value():
    with pytest.raises(ConfigError, match=r"invalid --with='foo==': 'foo==' is not a requirement"):
        resolve_config(flags={"with_packages": ("foo==",)})
    with pytest.raises(ConfigError, match="DDPLAB_PRELOAD.*is not a module name"):
        resolve_config(environ={"DDPLAB_PRELOAD": "light-ning"})
    assert parse_modules("a.b,c d") == ("a.b", "c", "d")
    assert parse_requirements_file(" None ") == "" and parse_requirements_file("req.txt") == "req.txt"


# ----------------------------------------------------------------------------------- declarations


def test_a_declaration_names_its_kind_and_reads_paths_from_the_workspace(tmp_path):
    (tmp_path / "requirements.txt").write_text("tqdm\n")
    (tmp_path / "pylock.train.toml").write_text("")
    (tmp_path / "pyproject.toml").write_text("")
    assert read_declaration("", (), tmp_path) is None
    assert read_declaration("", ("tqdm",), tmp_path) == Declaration(extra=("tqdm",))
    assert read_declaration("requirements.txt", (), tmp_path).kind == "requirements"
    assert read_declaration("pylock.train.toml", (), tmp_path).kind == "pylock"
    grouped = read_declaration("pyproject.toml:train", ("einops",), tmp_path)
    assert (grouped.kind, grouped.group, grouped.extra) == ("pyproject", "train", ("einops",))
    assert grouped.shown == f"{tmp_path / 'pyproject.toml'}:train --with einops"


def test_a_missing_file_is_refused_listing_what_is_there(tmp_path):
    (tmp_path / "requirements-dev.txt").write_text("")
    with pytest.raises(ConfigError, match=r"invalid --requirements='reqs.txt': no such file") as caught:
        read_declaration("reqs.txt", (), tmp_path)
    assert "requirements-dev.txt" in caught.value.hint
    (tmp_path / "pylock.toml").write_text("")
    with pytest.raises(ConfigError, match="names the group 'x', but only a pyproject.toml has groups"):
        read_declaration(f"{tmp_path}/pylock.toml:x", (), tmp_path)


def test_a_pyproject_gives_its_dependencies_or_a_group_with_its_includes(tmp_path):
    path = tmp_path / "pyproject.toml"
    path.write_text('[project]\nname = "x"\ndependencies = ["tqdm>=4", "einops"]\n'
                    '[dependency-groups]\nbase = ["pyyaml"]\ntrain = ["lightning", {include-group = "base"}]\n')
    assert pyproject_requirements(Declaration(path)) == ["tqdm>=4", "einops"]
    assert pyproject_requirements(Declaration(path, "train")) == ["lightning", "pyyaml"]
    with pytest.raises(LabError, match="has no dependency group 'eval'") as caught:
        pyproject_requirements(Declaration(path, "eval"))
    assert "base, train" in caught.value.hint
    path.write_text('[dependency-groups]\ntrain = ["lightning"]\n')
    with pytest.raises(LabError, match=r"has no \[project\] dependencies") as caught:
        pyproject_requirements(Declaration(path))
    assert "pyproject.toml:GROUP" in caught.value.hint and "train" in caught.value.hint


def test_another_torch_is_refused_before_pip_runs_naming_both_releases():
    check_torch(["torch>=2.0", "tqdm"], "2.13.0", "--with")
    with pytest.raises(LabError, match="asks for torch==2.14.1, but this lab's nodes run torch 2.13.0") as caught:
        check_torch(["torch==2.14.1"], "2.13.0", "--with torch==2.14.1")
    assert "--torch-version 2.14.1" in caught.value.hint


def test_the_inputs_digest_follows_every_file_the_declaration_reads(tmp_path):
    (tmp_path / "base.txt").write_text("tqdm\n")
    (tmp_path / "requirements.txt").write_text("-r base.txt\neinops\n")
    declaration = read_declaration("requirements.txt", (), tmp_path)
    first = inputs_digest(declaration, "2.13.0", TARGET)
    assert inputs_digest(declaration, "2.13.0", TARGET) == first
    (tmp_path / "base.txt").write_text("tqdm==4.67.1\n")  # an included file changed: resolve again
    second = inputs_digest(declaration, "2.13.0", TARGET)
    assert second != first
    assert inputs_digest(declaration, "2.14.1", TARGET) != second
    assert inputs_digest(declaration, "2.13.0", Target(python="3.12")) != second


# ------------------------------------------------------------------------------------------ lock


def test_the_lock_is_a_pylock_toml_that_reads_back_the_same(tmp_path):
    text = render_lock(LOCK, TARGET)
    assert text.count("[[packages]]") == 3 and 'lock-version = "1.0"' in text and "created-by" in text
    assert parse_lock(text, "x", TARGET) == LOCK  # selected for the node's Python by packaging.pylock
    (tmp_path / "pylock.toml").write_text(text)
    assert read_lab_lock(tmp_path / "pylock.toml") == LOCK  # the fast reader, for every run's preflight
    assert read_lab_lock(tmp_path / "none.toml") is None
    assert describe_lock_file(tmp_path / "pylock.toml") == f"{tmp_path / 'pylock.toml'} (packages {LOCK.short}, 3 pinned)"


def test_the_digest_is_the_package_set_alone():
    reordered = Lock(tuple(reversed(LOCK.pins)), "other inputs", ("other",))
    assert reordered.digest == LOCK.digest and len(LOCK.short) == 12
    changed = Lock((pin("tqdm", "4.67.1", "d" * 64),) + LOCK.pins[1:])
    assert changed.digest != LOCK.digest


def test_a_users_lock_gives_the_one_wheel_for_the_node():
    text = """lock-version = "1.0"
created-by = "uv"
[[packages]]
name = "markupsafe"
version = "3.0.4"
wheels = [
  {name = "markupsafe-3.0.4-cp311-cp311-macosx_11_0_arm64.whl", url = "https://x/m1.whl", hashes = {sha256 = "11"}},
  {name = "markupsafe-3.0.4-cp311-cp311-manylinux_2_17_x86_64.whl", url = "https://x/m2.whl", hashes = {sha256 = "22"}},
]
[[packages]]
name = "pywin32"
version = "311"
marker = "sys_platform == 'win32'"
wheels = [{name = "pywin32-311-cp311-cp311-win_amd64.whl", url = "https://x/w.whl", hashes = {sha256 = "33"}}]
"""
    lock = parse_lock(text, "pylock.toml", TARGET)
    assert [(p.name, p.wheel, p.sha256) for p in lock.pins] == [
        ("markupsafe", "markupsafe-3.0.4-cp311-cp311-manylinux_2_17_x86_64.whl", "22")]


@pytest.mark.parametrize("package, says", [
    ('name = "x"\nversion = "1.0"\nsdist = {name = "x-1.0.tar.gz", url = "https://x/x.tar.gz", hashes = {sha256 = "1"}}',
     "x comes as a sdist, not one wheel"),
    ('name = "x"\nversion = "1.0"\nwheels = [{name = "x-1.0-py3-none-any.whl", url = "https://x/x.whl", '
     'hashes = {md5 = "1"}}]', "has no sha256 hash"),
    ('name = "x"\nversion = "1.0"', "not a valid pylock.toml"),
])
def test_a_users_lock_the_nodes_cannot_install_is_refused(package, says):
    with pytest.raises(LabError, match=says):
        parse_lock(f'lock-version = "1.0"\ncreated-by = "me"\n[[packages]]\n{package}\n', "pylock.toml", TARGET)


def test_pips_report_gives_the_pins_the_nodes_markers_leave():
    report = {"install": [
        {"metadata": {"name": "tqdm", "version": "4.67.1"}, "requested": True,
         "download_info": {"url": "https://files/tqdm-4.67.1-py3-none-any.whl",
                           "archive_info": {"hashes": {"sha256": "ab"}, "hash": "sha256=ab"}}},
        {"metadata": {"name": "Colorama", "version": "0.4.6"},
         "download_info": {"url": "file:///opt/pypi/colorama-0.4.6-py2.py3-none-any.whl",
                           "archive_info": {"hash": "sha256=cd"}}},
    ]}
    pins = lock_from_report(report["install"], {"tqdm-4.67.1-py3-none-any.whl", "colorama-0.4.6-py2.py3-none-any.whl"})
    assert pins == [Pin("colorama", "0.4.6", "colorama-0.4.6-py2.py3-none-any.whl",
                        "file:///opt/pypi/colorama-0.4.6-py2.py3-none-any.whl", "cd"),
                    Pin("tqdm", "4.67.1", "tqdm-4.67.1-py3-none-any.whl", "https://files/tqdm-4.67.1-py3-none-any.whl",
                        "ab")]
    assert lock_from_report(report["install"], {"tqdm-4.67.1-py3-none-any.whl"})[0].name == "tqdm"  # a host's alone


def test_pip_installs_the_pins_in_hash_checking_mode():
    assert hash_requirements([pin("tqdm", "4.67.1", "b" * 64)]) == f"tqdm==4.67.1 --hash=sha256:{'b' * 64}\n"


def test_an_image_gets_what_it_lacks_never_torch():
    installed = {"torch": "2.13.0+cpu", "numpy": "2.4.6", "tqdm": "4.66.6", "pip": "23.0.1"}
    assert [p.line for p in to_install(LOCK, installed)] == ["tqdm==4.67.1"]
    assert [p.line for p in to_install(LOCK, {"torch": "2.13.0"})] == ["numpy==2.4.6", "tqdm==4.67.1"]  # a CUDA image
    with pytest.raises(LabError, match="the lock asks for torch 2.13.0.cpu, but this lab's nodes run torch 2.14.1"):
        to_install(LOCK, {"torch": "2.14.1"})


def test_a_package_image_is_named_after_its_node_image_and_lock():
    tag = package_tag("ddplab-node:torch2.13.0-cpu", "3fa2b1c9d0e1ffff")
    assert tag == "ddplab-node:torch2.13.0-cpu-pkgs-3fa2b1c9d0e1"
    assert base_of(tag) == "ddplab-node:torch2.13.0-cpu" and base_of("ddplab-node:x") == "ddplab-node:x"
    assert package_tag("registry:5000/team/node", "ab" * 8) == "registry:5000/team/node:latest-pkgs-abababababab"


# ---------------------------------------------------------------------------------- pip's words


def said(name: str) -> str:
    return (PIP / f"{name}.txt").read_text()


def test_an_unknown_version_names_what_the_index_offers():
    # pip install --dry-run --report R <node target> torch==2.13.0 tqdm==99
    error = explain_pip_failure(said("version"), TARGET, "2.13.0")
    assert type(error) is LabError and error.exit_code == 2
    assert error.message.startswith("no version of tqdm==99 on the package index matches: it offers 149 versions")
    assert "4.70.1" in error.message and error.hint == "ask for one of them, e.g. tqdm==4.70.1"


def test_an_unknown_package_names_it_and_the_nodes_platform():
    # ... torch==2.13.0 nosuchpkg-xyz-ddplab
    error = explain_pip_failure(said("unknown"), TARGET, "2.13.0")
    assert type(error) is LabError
    assert "no wheel of nosuchpkg-xyz-ddplab for the nodes (CPython 3.11, manylinux glibc 2.36, x86_64)" in error.message


def test_a_bad_line_of_a_requirements_file_is_named_with_its_number():
    # pip install --dry-run -r requirements.txt, its line 2 `foo==`
    error = explain_pip_failure(said("badline"), TARGET, "2.13.0")
    assert error.message.startswith("/tmp/requirements.txt line 2: 'foo==': Expected semicolon")


@pytest.mark.parametrize("sample, says", [
    ("torchconflict", "the requirements ask for torch==2.14.1, but this lab's nodes run torch 2.13.0"),  # torch==2.14.1
    ("depconflict", "torchvision 0.29.1 needs torch>=2.14.0, but this lab's nodes run torch 2.13.0"),  # torchvision==0.29.1
])
def test_a_requirement_of_another_torch_is_refused_naming_both_releases(sample, says):
    error = explain_pip_failure(said(sample), TARGET, "2.13.0")
    assert error.message.startswith(says) and "--torch-version 2.14." in error.hint


def test_another_conflict_is_said_as_pip_says_it():
    # pip install --dry-run lightning-utilities==0.15.3 'packaging<20'
    error = explain_pip_failure(said("conflict"), TARGET, "2.13.0")
    assert error.message == ("pip cannot satisfy the requirements together: The user requested packaging<20; "
                             "lightning-utilities 0.15.3 depends on packaging>=22")


def test_no_index_is_the_machines_state_and_names_what_is_missing():
    # PIP_INDEX_URL=https://127.0.0.1:9/simple PIP_RETRIES=1 pip install --dry-run einops
    error = explain_pip_failure(said("unreachable"), TARGET, "2.13.0", cached=["tqdm-4.67.1-py3-none-any.whl"])
    assert type(error) is StateError and error.exit_code == 1
    assert error.message.startswith("no package index answers, and no cached wheel has einops for the nodes")
    assert "tqdm-4.67.1-py3-none-any.whl" in error.hint


def test_anything_else_pip_says_is_left_to_the_caller():
    assert explain_pip_failure("ERROR: Exception: something else", TARGET, "2.13.0") is None


def test_the_samples_are_pips_own_words():
    """Each sample holds what pip printed, not a paraphrase: its ERROR lines are there."""
    for path in PIP.glob("*.txt"):
        assert "ERROR:" in path.read_text(), path.name
    assert json.dumps(said("version"))  # plain text
