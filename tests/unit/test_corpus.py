"""The gpt corpus is one pinned text: the same bytes from every Python, on the host and in the nodes
(every Python at hand makes them in tests/host/test_corpus.py)."""

from __future__ import annotations

import pytest

from trainer import corpus


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
