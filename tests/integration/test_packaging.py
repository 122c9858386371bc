"""A non-editable install of ddplab works from any folder, as a user gets it.

The repository's files (what `pip install git+https://...` clones, with this checkout's uncommitted
work) are built into a wheel both in-tree (as `pip install git+...` and `pip install .` do) and
through an sdist (as `python -m build` does), and the wheel is installed into a fresh virtual
environment with its dependencies from pip's configured index. Then, from an empty folder outside
the repository, with an empty cache folder: `up --dry-run`, `build --print-hash` (the same hash as
the checkout's, so the image the checkout built is up to date), `build`, and a 2-node lab that
trains and goes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import REPO, lab_resources, labctl, new_lab_name, summary_of

pytestmark = pytest.mark.integration
PIP_TIMEOUT_S = 600


def sh(argv: list, cwd: Path | None = None, env: dict | None = None, timeout: float = PIP_TIMEOUT_S):
    result = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(map(str, argv))} -> {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


def copy_repository(dest: Path) -> Path:
    """The files git would give a clone, plus this checkout's uncommitted and untracked work."""
    listed = sh(["git", "-C", REPO, "ls-files", "-z", "--cached", "--others", "--exclude-standard"]).stdout
    for name in filter(None, listed.split("\0")):
        if (REPO / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name)
    return dest


def user_env(venv: Path, cache: Path) -> dict:
    """The environment of a user who installed ddplab into `venv`: nothing of this checkout on any path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", XDG_CACHE_HOME=str(cache), COLUMNS="200")
    env.pop("DDPLAB_CACHE_DIR", None)
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory, docker_client, node_image):
    root = tmp_path_factory.mktemp("packaging")
    src = copy_repository(root / "src")
    venv = root / "venv"
    sh([sys.executable, "-m", "venv", venv])
    pip = [venv / "bin" / "python", "-m", "pip", "--disable-pip-version-check"]
    sh([*pip, "wheel", "--quiet", "--no-deps", "-w", root / "in-tree", src], cwd=root)
    sh([*pip, "install", "--quiet", "setuptools>=68"])
    sh([venv / "bin" / "python", "-c", "import setuptools.build_meta as b, sys; b.build_sdist(sys.argv[1])",
        root / "sdist"], cwd=src)
    (sdist,) = (root / "sdist").glob("ddplab-*.tar.gz")
    sh([*pip, "wheel", "--quiet", "--no-deps", "-w", root / "from-sdist", sdist], cwd=root)
    (in_tree,), (from_sdist,) = (root / "in-tree").glob("*.whl"), (root / "from-sdist").glob("*.whl")
    names = [sorted(zipfile.ZipFile(w).namelist()) for w in (in_tree, from_sdist)]
    assert names[0] == names[1], f"the sdist loses files: {sorted(set(names[0]) ^ set(names[1]))}"
    sh([*pip, "install", "--quiet", from_sdist])
    project = root / "project"
    project.mkdir()
    yield venv, user_env(venv, root / "xdg-cache"), project
    for heavy in ("venv", "xdg-cache"):  # 300 MB that pytest would otherwise keep for three sessions
        shutil.rmtree(root / heavy, ignore_errors=True)


def installed_labctl(installed, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    venv, env, project = installed
    return subprocess.run([venv / "bin" / "labctl", *args], cwd=project, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_the_wheel_carries_the_lab_files_and_runs_without_the_checkout(installed):
    venv, env, project = installed
    probe = sh([venv / "bin" / "python", "-c", "import json, labctl, labctl.core.assets as a; print(json.dumps("
                "[labctl.__file__, a.is_checkout(), str(a.source_root()), str(a.cache_dir())]))"], cwd=project, env=env)
    module, checkout, source, cache = json.loads(probe.stdout)
    assert Path(module).is_relative_to(venv) and not checkout
    assert Path(source) == Path(module).parent / "_data"
    assert cache == env["XDG_CACHE_HOME"] + "/ddplab"
    for name in ("Dockerfile", ".dockerignore", "compose/lab.yaml", "compose/node-entrypoint.sh", "trainer/train.py"):
        assert (Path(source) / name).read_bytes() == (REPO / name).read_bytes(), name
    assert os.access(Path(source) / "compose" / "node-entrypoint.sh", os.X_OK)


def test_up_dry_run_renders_the_lab_from_the_packaged_template(installed):
    lab = new_lab_name()
    result = installed_labctl(installed, "up", "--lab", lab, "--nodes", "2", "--dry-run", timeout=120)
    assert result.returncode == 0, result.stderr
    assert f"container_name: {lab}-node1" in result.stdout and "/opt/ddplab/node-entrypoint.sh" in result.stdout
    assert "Traceback" not in result.stderr


def test_build_finds_the_checkouts_image_up_to_date(installed, docker_client, node_image):
    """The input hash from the installed copies equals the checkout's: `labctl build` would otherwise
    rebuild the image on every CI run. Checked before `build`, so a mismatch fails here rather than
    retagging the shared image."""
    from_checkout = labctl("build", "--print-hash", "--json", check=True)
    checkout = json.loads(from_checkout.stdout)
    result = installed_labctl(installed, "build", "--print-hash", "--json")
    assert result.returncode == 0, result.stderr
    mine = json.loads(result.stdout)
    assert mine["hash"] == checkout["hash"], (mine, checkout)
    assert Path(mine["context"]) == Path(installed[1]["XDG_CACHE_HOME"]) / "ddplab" / "build"
    assert mine["up_to_date"], f"{node_image} was built from other inputs ({mine['image_hash']}); `make image` first"
    image_id = docker_client.images.get(node_image).id
    built = installed_labctl(installed, "build")
    assert built.returncode == 0, built.stderr
    assert f"image {node_image} up to date" in built.stderr
    assert docker_client.images.get(node_image).id == image_id

    # --lean on an image that is up to date: the wheels go, their names stay, and the hash with them.
    wheelhouse = Path(mine["context"]) / ".lab" / "wheelhouse"
    assert list(wheelhouse.glob("torch-*.whl"))
    lean = installed_labctl(installed, "build", "--lean")
    assert lean.returncode == 0, lean.stderr
    assert f"image {node_image} up to date" in lean.stderr and "lean: removed the wheelhouse's wheels" in lean.stderr
    assert not list(wheelhouse.glob("*.whl"))
    again = installed_labctl(installed, "build", "--print-hash", "--json")
    assert again.returncode == 0 and "wheelhouse: downloading" not in again.stderr, again.stderr
    assert json.loads(again.stdout)["hash"] == checkout["hash"] and json.loads(again.stdout)["up_to_date"]
    assert docker_client.images.get(node_image).id == image_id


def test_a_lab_from_an_empty_folder_trains_and_goes(installed, docker_client, node_image):
    lab = new_lab_name()
    try:
        up = installed_labctl(installed, "up", "--lab", lab, "--nodes", "2")
        assert up.returncode == 0, up.stderr
        run = installed_labctl(installed, "run", "--lab", lab, "--", "-m", "trainer", "--epochs", "1")
        assert run.returncode == 0, run.stderr[-3000:]
        summary = summary_of(run.stdout + run.stderr)
        assert summary["world_size"] == 2 and summary["replicas_consistent"]
        assert Path(summary["run_dir"]).is_relative_to(installed[2]), "the run's logs belong in the user's folder"
    finally:
        down = installed_labctl(installed, "down", "--lab", lab, "--volumes")
    assert down.returncode == 0, down.stderr
    assert lab_resources(docker_client, lab) == {"containers": [], "networks": [], "volumes": []}
