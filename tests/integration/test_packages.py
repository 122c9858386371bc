"""Your project's packages on every node (issue 39), for real: resolved on the host by pip from the
package index, one package image per lock, every node the same version; bad input refused with the
running lab left as it was; a second `up` that builds nothing; changing the packages, and preloading
one in the fork servers."""

from __future__ import annotations

import json
import re

import pytest

from conftest import REPO, drop_lab, labctl, new_lab_name, summary_of

TQDM_SCRIPT = "examples/packages/tqdm_ddp.py"
# A package index that refuses every connection, and no local copy of anything: no index answers.
NO_INDEX = {"PIP_CONFIG_FILE": "/dev/null", "PIP_INDEX_URL": "https://127.0.0.1:9/simple", "PIP_FIND_LINKS": "",
            "PIP_EXTRA_INDEX_URL": "", "PIP_RETRIES": "1", "PIP_TIMEOUT": "2"}


@pytest.fixture(scope="module")
def tqdm_lab(docker_client, node_image):
    """3 nodes with tqdm, the first `up` of this module that asks for it (its lock may be cached)."""
    name = new_lab_name()
    up = labctl("up", "--lab", name, "--nodes", "3", "--with", "tqdm", "--json", timeout=600, check=True)
    yield name, json.loads(up.stdout)
    drop_lab(name)


def containers(docker_client, lab: str) -> dict[str, tuple[str, str]]:
    """Each node's container id and image id: what a refused `up` must leave as it was."""
    found = docker_client.api.containers(all=True, filters={"label": [f"io.ddplab.lab={lab}", "io.ddplab.node"]})
    return {c["Names"][0]: (c["Id"], c["ImageID"]) for c in found}


def test_every_node_imports_one_tqdm_and_a_plain_lab_fails_as_it_should(tqdm_lab, docker_client, lab_name):
    lab, status = tqdm_lab
    hashes = {n["packages"] for n in status["nodes"]}
    assert len(hashes) == 1 and None not in hashes, status
    summary = summary_of(labctl("run", "--lab", lab, "--", TQDM_SCRIPT, "--steps", "5", check=True).stdout)
    lock = (REPO / ".lab" / lab / "pylock.toml").read_text()
    [version] = re.findall(r'name = "tqdm"\nversion = "([^"]+)"', lock)
    assert summary["tqdm"] == [version] * 3 and summary["same_tqdm"], summary

    labctl("up", "--lab", lab_name, "--nodes", "2", check=True)  # a plain lab: no tqdm on any node
    failed = labctl("run", "--lab", lab_name, "--", TQDM_SCRIPT, "--steps", "5")
    assert failed.returncode != 0 and "ModuleNotFoundError: No module named 'tqdm'" in failed.stderr


def test_the_lab_shows_its_lock_and_doctor_compares_every_node_with_it(tqdm_lab):
    lab, status = tqdm_lab
    dry = labctl("run", "--lab", lab, "--dry-run", "--", TQDM_SCRIPT, check=True).stdout
    [named] = [line for line in dry.splitlines() if line.startswith("# packages: ")]
    assert f".lab/{lab}/pylock.toml (packages {status['nodes'][0]['packages']}, " in named
    doctor = json.loads(labctl("doctor", "--lab", lab, "--json", check=True).stdout)
    [packages] = [f for f in doctor["findings"] if f["check"] == "packages"]
    assert packages["ok"] and f".lab/{lab}/pylock.toml" in packages["message"], packages


def test_a_second_up_with_the_same_packages_builds_nothing_and_recreates_no_node(tqdm_lab, docker_client):
    lab, _ = tqdm_lab
    before = containers(docker_client, lab)
    again = labctl("up", "--lab", lab, "--with", "tqdm", check=True)
    plain = labctl("up", "--lab", lab, check=True)  # no packages asked: the lab keeps its own
    assert containers(docker_client, lab) == before
    for done in (again, plain):
        assert "packages: resolving" not in done.stderr and "packages: installing" not in done.stderr, done.stderr


# A dependency that needs another torch (torchvision 0.29.1) is refused the same way; pip's own words for
# it are in tests/unit/pip/depconflict.txt (its backtracking through torchvision's releases costs 10 s here).
BAD_INPUT = [
    pytest.param(["--with", "nosuchpkg-ddplab-xyz"], {}, 2,
                 r"the package index has no wheel of nosuchpkg-ddplab-xyz for the nodes \(CPython 3\.\d+", id="unknown"),
    pytest.param(["--with", "tqdm==99"], {}, 2, r"no version of tqdm==99 on the package index matches: it offers \d+ "
                 "versions, the latest", id="version"),
    pytest.param(["--requirements", "tests/integration/scripts/bad-requirements.txt"], {}, 2,
                 r"bad-requirements\.txt line 3: 'tqdm==': Expected", id="malformed"),
    pytest.param(["--with", "torch==2.14.1"], {}, 2,
                 r"asks for torch==2\.14\.1, but this lab's nodes run torch 2\.13\.0", id="torch"),
    pytest.param(["--with", "einops==0.7.0"], NO_INDEX, 1,  # never fetched: no test ever resolves it with an index
                 r"no package index answers, and no cached wheel has einops==0\.7\.0 for the nodes", id="no-index"),
]


@pytest.mark.parametrize("args, env, status, message", BAD_INPUT)
def test_bad_packages_are_refused_and_leave_the_lab_as_it_was(tqdm_lab, docker_client, args, env, status, message):
    lab, _ = tqdm_lab
    before = containers(docker_client, lab)
    refused = labctl("up", "--lab", lab, *args, env=env, timeout=300)
    assert refused.returncode == status, refused.stderr
    assert re.search(message, refused.stderr) and "Traceback" not in refused.stderr, refused.stderr
    assert containers(docker_client, lab) == before


def test_after_every_refusal_the_lab_runs_what_it_ran(tqdm_lab):
    lab, _ = tqdm_lab
    summary = summary_of(labctl("run", "--lab", lab, "--", TQDM_SCRIPT, "--steps", "2", check=True).stdout)
    assert summary["same_tqdm"] and len(summary["tqdm"]) == 3


def test_preloaded_packages_are_imported_before_the_script_starts(tqdm_lab, docker_client):
    """jinja2 (in every node, for torch's compiler) is a module `import torch` does not import itself:
    tqdm is no test of this, torch imports it where it is installed."""
    lab, _ = tqdm_lab
    labctl("up", "--lab", lab, "--preload", "jinja2", check=True)
    script = "tests/integration/scripts/preloaded.py"
    out = labctl("run", "--lab", lab, "--launcher", "warm", "--", script, "jinja2", check=True).stdout
    assert out.count("jinja2 preloaded: True") == 3, out
    labctl("up", "--lab", lab, check=True)  # not asked: the lab keeps its preload, and its servers
    for node in ("node0", "node1", "node2"):
        # A server's parent is the node's PID 1 (started in the background by a shell that has exited);
        # a run's workers, forked from it, carry its command line too.
        servers = docker_client.containers.get(f"{lab}-{node}").exec_run(
            ["pgrep", "-P", "1", "-af", "serve /tmp/ddplab/fork-"])
        lines = servers.output.decode().splitlines()
        assert len(lines) == 1 and "jinja2" in lines[0].split(), lines  # one server, with jinja2
    labctl("up", "--lab", lab, "--preload", "", check=True)  # none: the servers start again without it
    out = labctl("run", "--lab", lab, "--launcher", "warm", "--", script, "jinja2", check=True).stdout
    assert out.count("jinja2 preloaded: False") == 3, out


def test_changing_the_packages_reconciles_the_lab_and_none_takes_them_away(tqdm_lab, docker_client):
    lab, status = tqdm_lab
    changed = json.loads(labctl("up", "--lab", lab, "--with", "tqdm", "--with", "einops", "--json",
                                timeout=600, check=True).stdout)
    assert {n["packages"] for n in changed["nodes"]} != {status["nodes"][0]["packages"]}
    for node in ("node0", "node2"):
        found = docker_client.containers.get(f"{lab}-{node}").exec_run(
            ["python", "-c", "import einops, tqdm; print(einops.__version__, tqdm.__version__)"])
        assert found.exit_code == 0, found.output
    plain = json.loads(labctl("up", "--lab", lab, "--requirements", "none", "--json", check=True).stdout)
    assert {n["packages"] for n in plain["nodes"]} == {None}
    assert not (REPO / ".lab" / lab / "pylock.toml").exists()
    gone = docker_client.containers.get(f"{lab}-node1").exec_run(["python", "-c", "import tqdm"])
    assert gone.exit_code != 0  # the module's last test: its lab stays plain


@pytest.mark.alone  # gc removes every package image no container runs: no other test's lab may be mid-`up`
def test_gc_removes_package_images_no_lab_runs_and_up_makes_them_again(docker_client, lab_name):
    up = labctl("up", "--lab", lab_name, "--nodes", "2", "--with", "tqdm", timeout=600, check=True)
    tag = docker_client.containers.get(f"{lab_name}-node0").attrs["Config"]["Image"]
    assert "-pkgs-" in tag, up.stderr
    labctl("down", "--lab", lab_name, check=True)
    collected = labctl("gc", check=True)
    assert f"removed package image {tag}: no lab's node runs it (a package set no lab uses now)" in collected.stderr
    assert not docker_client.images.list(name=tag)
    again = labctl("up", "--lab", lab_name, "--nodes", "2", "--with", "tqdm", timeout=600, check=True)
    assert f"packages: image {tag} made" in again.stderr, again.stderr  # from the cached lock and wheels:
    assert "resolving" not in again.stderr and "downloading" not in again.stderr  # no index asked
