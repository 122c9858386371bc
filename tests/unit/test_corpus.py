"""The gpt corpus is one pinned text: the same bytes from every Python, on the host and in the nodes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trainer import corpus

REPO = Path(__file__).resolve().parents[2]
HASH_SCRIPT = ("import sys; sys.path.insert(0, sys.argv[1]); from trainer import corpus; "
               "print(corpus.sha256(corpus.generate(corpus.PINNED_CHARS)))")


def test_the_text_is_the_pinned_one():
    text = corpus.generate(corpus.PINNED_CHARS)
    assert len(text) == corpus.PINNED_CHARS
    assert corpus.sha256(text) == corpus.CORPUS_SHA256, "trainer/corpus.py changed: update the pin"
    assert corpus.build(corpus.PINNED_CHARS) == text


def test_shorter_and_longer_corpora_extend_the_same_text():
    full = corpus.generate(corpus.PINNED_CHARS)
    assert corpus.build(10_000) == full[:10_000]
    longer = corpus.build(corpus.PINNED_CHARS + 5_000)
    assert len(longer) == corpus.PINNED_CHARS + 5_000 and longer.startswith(full)


def test_a_changed_generator_is_refused(monkeypatch):
    monkeypatch.setattr(corpus, "SEED", corpus.SEED + 1)
    monkeypatch.setattr(corpus.generate, "__defaults__", (corpus.SEED,))
    with pytest.raises(SystemExit, match="not the pinned"):
        corpus.build(10_000)


def test_it_looks_like_python_and_is_plain_ascii():
    text = corpus.generate(50_000)
    assert text.isascii()
    assert text.count("def ") > 50 and "class " in text and "return " in text and '"""' in text
    compile(text[: text.rindex("\ndef ")], "<corpus>", "exec")  # whole functions parse as Python


def test_the_generator_is_deterministic_and_depends_on_its_seed():
    assert corpus.generate(5_000) == corpus.generate(5_000)
    assert corpus.generate(5_000, seed=1) != corpus.generate(5_000)
    rng = corpus.SplitMix64(0)
    # the first outputs of SplitMix64 seeded with 0, as published with the algorithm
    assert [rng.next() for _ in range(3)] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]


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
