"""Packaging hook: a wheel of ddplab carries the files a lab is made from besides Python modules.

The Dockerfile, .dockerignore, compose/ and trainer/ stay at the top of the repository, where
`docker build` and people look for them. A wheel built from this tree (`pip install .`,
`pip install "ddplab @ git+https://..."`) gets copies under labctl/_data/, which labctl/core/assets.py
reads when labctl is not imported from a checkout. Everything else is declared in pyproject.toml.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

TOP = Path(__file__).resolve().parent
# Relative to the top of the repository; labctl/core/assets.py's SHIPPED names the same (a unit test checks).
SHIPPED = ("Dockerfile", "Dockerfile.cuda", ".dockerignore", "compose/lab.yaml", "compose/node-entrypoint.sh",
           "compose/slurm-node.sh", "compose/overlay/Dockerfile", "trainer")


class BuildPyWithAssets(build_py):
    """build_py, then copy SHIPPED into the wheel's labctl/_data/ (not for an editable install,
    which reads the checkout itself)."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        data = Path(self.build_lib) / "labctl" / "_data"
        if data.exists():
            shutil.rmtree(data)
        for name in SHIPPED:
            src, dst = TOP / name, data / name
            if not src.exists():
                raise SystemExit(f"setup.py: {src} is missing; a ddplab wheel needs it (labctl/core/assets.py)")
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.is_dir():
                shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                shutil.copy2(src, dst)


setup(cmdclass={"build_py": BuildPyWithAssets})
