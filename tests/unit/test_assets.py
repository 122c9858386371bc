"""Where labctl finds its non-Python files and caches: a checkout, or an installed package's copies.

The real wheel is built and installed by tests/integration/test_packaging.py; here the rules, on
folders laid out as a checkout and as site-packages are.
"""

from __future__ import annotations

import ast
import fnmatch
import stat
from pathlib import Path

import pytest

from labctl.core import assets
from labctl.errors import StateError
from labctl.image.image import build_hash, image_inputs

REPO = Path(__file__).resolve().parents[2]


def shipped_in_setup_py() -> tuple[str, ...]:
    tree = ast.parse((REPO / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "SHIPPED" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    raise AssertionError("setup.py has no SHIPPED")


def test_setup_py_ships_what_assets_reads():
    assert shipped_in_setup_py() == assets.SHIPPED
    for path in assets.SHIPPED:
        assert (REPO / path).exists(), path


def in_manifest(path: str, lines: list[list[str]]) -> bool:
    """Whether MANIFEST.in's `include` and `recursive-include` lines (split in words) take `path`."""
    for command, *args in lines:
        if command == "include" and path in args:
            return True
        if command == "recursive-include" and path.startswith(args[0] + "/") and any(
                fnmatch.fnmatch(path.rsplit("/", 1)[-1], pattern) for pattern in args[1:]):
            return True
    return False


def test_manifest_puts_every_shipped_file_in_an_sdist():
    lines = [line.split() for line in (REPO / "MANIFEST.in").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    for path in assets.SHIPPED:
        files = [path] if (REPO / path).is_file() else [str(p.relative_to(REPO)) for p in (REPO / path).rglob("*.py")]
        for name in files:
            assert in_manifest(name, lines), f"MANIFEST.in does not take {name}: an sdist would lack it, and so the wheel"


def test_this_checkout_is_found():
    assert assets.is_checkout()
    assert assets.source_root() == REPO
    assert assets.compose_template() == REPO / "compose" / "lab.yaml"
    assert assets.trainer_path_entry() == REPO
    assert assets.cache_dir() == REPO / ".lab"
    assert assets.build_context() == REPO
    assert assets.wheelhouse(assets.build_context()) == REPO / ".lab" / "wheelhouse"


def installed_layout(tmp_path: Path) -> tuple[Path, Path]:
    """site-packages/labctl/_data with copies of SHIPPED, as a wheel installs them."""
    site = tmp_path / "site-packages"
    data = site / "labctl" / "_data"
    assets.prepare_build_context(data, REPO)
    return site, data


def test_an_installed_package_reads_its_copies(tmp_path):
    site, data = installed_layout(tmp_path)
    assert not assets.is_checkout(site)
    assert assets.source_root(site, data) == data


def test_neither_checkout_nor_copies_is_a_state_error_naming_what_is_missing(tmp_path):
    site = tmp_path / "site-packages"
    data = site / "labctl" / "_data"
    (data / "compose").mkdir(parents=True)
    (data / "Dockerfile").write_text("FROM scratch\n")
    with pytest.raises(StateError) as caught:
        assets.source_root(site, data)
    message = str(caught.value)
    missing = message.split("missing in ")[1].split(": ", 1)[1]
    assert "compose/lab.yaml" in missing and "trainer" in missing
    assert "Dockerfile" not in missing.split(", ")  # the one that is there
    assert caught.value.exit_code == 1 and "reinstall" in caught.value.hint


@pytest.mark.parametrize("environ, expected", [
    ({"XDG_CACHE_HOME": "/x/cache", "HOME": "/home/u"}, "/x/cache/ddplab"),
    ({"HOME": "/home/u"}, "/home/u/.cache/ddplab"),
    ({"XDG_CACHE_HOME": "", "HOME": "/home/u"}, "/home/u/.cache/ddplab"),
])
def test_an_installed_labctl_caches_in_the_xdg_folder(monkeypatch, environ, expected):
    monkeypatch.setattr(assets, "is_checkout", lambda checkout=None: False)
    assert assets.cache_dir("", environ) == Path(expected)
    assert assets.cache_dir("/elsewhere", environ) == Path("/elsewhere")


def test_configured_cache_dir_moves_the_build_context_out_of_the_checkout(tmp_path):
    assert assets.cache_dir(str(tmp_path)) == tmp_path
    assert assets.build_context(str(tmp_path)) == tmp_path / "build"


def test_build_context_copy_hashes_as_the_checkout(tmp_path):
    context = assets.prepare_build_context(tmp_path / "build", REPO)
    wheels, args = ["torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"], {"TORCH_VERSION": "2.13.0"}
    assert [p.relative_to(context) for p in sorted(image_inputs(context))] == \
        [p.relative_to(REPO) for p in sorted(image_inputs(REPO))]
    assert build_hash(image_inputs(context), wheels, args, context) == build_hash(image_inputs(REPO), wheels, args, REPO)
    assert not list(context.rglob("__pycache__"))
    assert (context / "compose" / "node-entrypoint.sh").stat().st_mode & stat.S_IXUSR


def test_build_context_is_refreshed_not_merged(tmp_path):
    """A file the trainer no longer has must not stay in the image's inputs from an older labctl."""
    context = tmp_path / "build"
    assets.prepare_build_context(context, REPO)
    (context / "trainer" / "gone.py").write_text("print('from an older release')\n")
    (context / "compose" / "node-entrypoint.sh").chmod(0o644)
    (context / ".lab" / "wheelhouse").mkdir(parents=True)
    (context / ".lab" / "wheelhouse" / "kept.whl").write_text("")
    assets.prepare_build_context(context, REPO)
    assert not (context / "trainer" / "gone.py").exists()
    assert (context / "compose" / "node-entrypoint.sh").stat().st_mode & stat.S_IXUSR
    assert (context / ".lab" / "wheelhouse" / "kept.whl").exists(), "the wheelhouse is a cache: it stays"


def test_the_checkout_is_its_own_context():
    assert assets.prepare_build_context(REPO, REPO) == REPO
