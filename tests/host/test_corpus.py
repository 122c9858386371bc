"""The gpt corpus's pinned bytes from every Python at hand: this one and the other CPythons pyenv has,
each in a process of its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trainer import corpus

REPO = Path(__file__).resolve().parents[2]
HASH_SCRIPT = ("import sys; sys.path.insert(0, sys.argv[1]); from trainer import corpus; "
               "print(corpus.sha256(corpus.generate(corpus.PINNED_CHARS)))")


def other_pythons() -> list[str]:
    import shutil

    if not shutil.which("pyenv"):
        return []
    out = []
    for version in subprocess.run(["pyenv", "versions", "--bare"], capture_output=True, text=True).stdout.split():
        major_minor = ".".join(version.split(".")[:2])
        prefix = subprocess.run(["pyenv", "prefix", version], capture_output=True, text=True).stdout.strip()
        python = Path(prefix) / "bin" / f"python{major_minor}"
        if major_minor in ("3.10", "3.12", "3.13") and python.exists():
            out.append(str(python))
    return out


@pytest.mark.parametrize("python", [sys.executable, *other_pythons()])
def test_every_python_makes_the_same_bytes(python):
    result = subprocess.run([python, "-c", HASH_SCRIPT, str(REPO)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == corpus.CORPUS_SHA256
