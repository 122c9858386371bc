"""Where labctl finds the files a lab is made from: in a checkout, or in an installed package.

A lab needs files that are not Python modules: the Compose template (compose/lab.yaml), and what
the node image is built from (the Dockerfile, .dockerignore, compose/node-entrypoint.sh and the
trainer's sources, which the image carries). In a checkout of the repository they sit at its top,
where the project keeps them. A wheel (`pip install .`, `pip install git+https://...`) carries
copies of them under labctl/_data/, put there by setup.py when the wheel is built. Which of the two
labctl reads is decided by where it was imported from: a checkout (PYTHONPATH, an editable install)
reads the checkout, anything else the package's copies.

Caches follow the same split. A checkout keeps its wheelhouse and the node-Python answers in its
own `.lab/`, as it always has, and builds the image from the checkout itself. An installed labctl
keeps them in DDPLAB_CACHE_DIR, else $XDG_CACHE_HOME/ddplab, else ~/.cache/ddplab, and builds the
image from a folder there (`build/`) that holds the package's copies and the wheelhouse laid out as
the Dockerfile expects. The image's input hash reads the same relative paths and contents either
way, so an image built from a checkout is up to date for an installed labctl of the same commit.

At the bottom of the package with config and errors: it imports nothing of labctl's above them.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Mapping

from labctl.errors import StateError

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # labctl/
CHECKOUT_DIR = PACKAGE_DIR.parent  # the repository's top, when labctl is imported from a checkout
DATA_DIR = PACKAGE_DIR / "_data"  # the copies a wheel carries (setup.py puts them there)
# What a wheel carries, relative to the repository's top; setup.py copies exactly these (a unit test
# checks that the two lists agree).
SHIPPED = ("Dockerfile", "Dockerfile.cuda", ".dockerignore", "compose/lab.yaml", "compose/node-entrypoint.sh",
           "compose/slurm-node.sh", "compose/overlay/Dockerfile", "trainer")
# A checkout has all of these at its top; site-packages, the parent of an installed labctl, has none.
CHECKOUT_MARKERS = ("pyproject.toml", "Dockerfile", "compose/lab.yaml")
STATE_DIR = ".lab"  # where a checkout keeps its caches, and where the Dockerfile reads the wheelhouse from


def is_checkout(checkout: Path = CHECKOUT_DIR) -> bool:
    """True when labctl runs from a checkout of the repository (PYTHONPATH or an editable install)."""
    return all((checkout / marker).is_file() for marker in CHECKOUT_MARKERS)


def source_root(checkout: Path = CHECKOUT_DIR, data: Path = DATA_DIR) -> Path:
    """The folder holding Dockerfile, compose/ and trainer/: the checkout, else the package's copies."""
    if is_checkout(checkout):
        return checkout
    if all((data / path).exists() for path in SHIPPED):
        return data
    missing = [path for path in SHIPPED if not (data / path).exists()]
    raise StateError(f"labctl runs from {PACKAGE_DIR}, which is neither a checkout of ddplab (no "
                     f"{', '.join(CHECKOUT_MARKERS)} in {checkout}) nor an installed package with its files "
                     f"(missing in {data}: {', '.join(missing)})",
                     hint="reinstall ddplab from a wheel built by its setup.py (pip install --force-reinstall "
                          "'ddplab @ git+https://...' or pip install PATH_TO_CHECKOUT), or run it from a checkout")


def dockerfile() -> Path:
    return source_root() / "Dockerfile"


def compose_template() -> Path:
    """compose/lab.yaml: the template every lab's Compose file is rendered from."""
    return source_root() / "compose" / "lab.yaml"


def overlay_dockerfile() -> Path:
    """compose/overlay/Dockerfile: the overlay's helper image (labctl.net.overlay_apply)."""
    return source_root() / "compose" / "overlay" / "Dockerfile"


def trainer_dir() -> Path:
    """The trainer's sources, as the image carries them."""
    return source_root() / "trainer"


def trainer_path_entry() -> Path:
    """The folder to put on PYTHONPATH so that `python -m trainer` imports this trainer, from any
    Python (bench scaling's host rows may run one that has no ddplab installed)."""
    return trainer_dir().parent


def cache_dir(configured: str = "", environ: Mapping[str, str] | None = None) -> Path:
    """Where labctl keeps what it downloads and works out for builds (the wheelhouse, the node's Python).

    `configured` (DDPLAB_CACHE_DIR) wins; else a checkout's own .lab/; else the XDG cache folder,
    which is the platform's convention rather than a labctl setting, so it is read here.
    """
    if configured:
        return Path(configured).expanduser().resolve()
    if is_checkout():
        return CHECKOUT_DIR / STATE_DIR
    environ = os.environ if environ is None else environ
    base = environ.get("XDG_CACHE_HOME") or str(Path(environ.get("HOME") or Path.home()) / ".cache")
    return Path(base).expanduser().resolve() / "ddplab"


def build_context(configured: str = "") -> Path:
    """The folder `docker build` runs in: a checkout itself (its .lab/wheelhouse is the wheelhouse),
    or, for an installed labctl or with DDPLAB_CACHE_DIR set, build/ in the cache folder."""
    if not configured and is_checkout():
        return CHECKOUT_DIR
    return cache_dir(configured) / "build"


def cuda_build_context(configured: str, torch_version: str) -> Path:
    """The folder the CUDA image (Dockerfile.cuda) is built in: one per torch release in the cache
    folder, never the checkout, so that the CPU image's build does not send the engine its GBs of
    CUDA wheels, and two releases' wheelhouses (the version-mismatch image's) do not replace each other."""
    return cache_dir(configured) / f"build-cuda-torch{torch_version}"


def wheelhouse(context: Path) -> Path:
    """Where the Dockerfile reads the node's wheels from (`COPY .lab/wheelhouse`), in a build context."""
    return context / STATE_DIR / "wheelhouse"


def prepare_build_context(context: Path, source: Path | None = None) -> Path:
    """Lay the image's inputs out in `context` as in the repository (copies of SHIPPED, refreshed on
    every build so a newer labctl never builds from older files); the checkout needs nothing."""
    source = source_root() if source is None else source
    if context.resolve() == source.resolve():
        return context
    context.mkdir(parents=True, exist_ok=True)
    for path in SHIPPED:
        src, dst = source / path, context / path
        if dst.is_dir():
            shutil.rmtree(dst)
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, dst)
            if dst.suffix == ".sh":
                # The image runs it as the nodes' entry point, and the input hash reads contents only:
                # an unpacker that dropped the mode must not give an image whose nodes cannot start.
                dst.chmod(0o755)
    return context
