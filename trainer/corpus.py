"""The gpt workload's corpus: Python-like source text, generated from a fixed seed, byte for byte
the same on every machine and every Python.

Why generated: the corpus used to be the standard library's own sources, which differ between
Python releases. The host's 3.11.7 and the nodes' 3.11.2 gave vocabularies of 101 and 102
characters, so one process on the host and two nodes in the lab trained on different data and
ended 0.07 apart in loss. A file that ships with the code would fix that too, but this is 200
lines instead of two megabytes, and it depends on nothing but integer arithmetic: its own random
generator (SplitMix64, not the `random` module, whose algorithms may change between releases),
no hash(), no set or dict iteration order, no floats. `CORPUS_SHA256` pins the text; a change to
anything here that changes a byte fails the unit test and must update the pin, which also names
the prepared files (trainer/gpt.py), so a data dir never serves text made by another version.

No torch here: tests run this module under other Pythons (3.10, 3.12, 3.13) and compare hashes.
"""

from __future__ import annotations

import hashlib

PINNED_CHARS = 2_000_000  # the pin covers this many characters; any other length is a prefix or extension
CORPUS_SHA256 = "d0e3bab686d0b2e4a789f2d773d6ea4496a451f5dc1d2286bb16a33ace6e8883"
SEED = 0x44445021  # "DDP!"

_MASK = (1 << 64) - 1


class SplitMix64:
    """Steele, Lea and Flood's SplitMix64: a few lines, 64-bit state, good enough for text."""

    def __init__(self, seed: int):
        self.state = seed & _MASK

    def next(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & _MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        return z ^ (z >> 31)

    def below(self, n: int) -> int:
        return self.next() % n  # the modulo bias over 2**64 is far below anything a model could see

    def pick(self, items):
        return items[self.below(len(items))]

    def chance(self, percent: int) -> bool:
        return self.below(100) < percent


NOUNS = ("rank", "node", "batch", "step", "loss", "grad", "bucket", "buffer", "world", "port", "host", "shard",
         "token", "layer", "weight", "bias", "epoch", "sample", "queue", "store", "group", "link", "rate",
         "delay", "peer", "tensor", "window", "vocab", "model", "state", "count", "total", "value", "item")
VERBS = ("compute", "gather", "reduce", "scale", "merge", "split", "load", "save", "check", "update", "send",
         "receive", "build", "parse", "count", "find", "wait", "clear", "apply", "shape", "measure", "sum")
ADJECTIVES = ("local", "global", "first", "last", "slow", "fast", "next", "new", "old", "shared", "total", "max")
PREPOSITIONS = ("for", "of", "from", "into", "on", "across", "over", "per")
OPERATORS = ("+", "-", "*", "//", "%")
COMPARISONS = ("<", ">", "==", "!=", "<=", ">=")
BUILTINS = ("len", "sum", "max", "min", "sorted", "abs")


class _Writer:
    """Draws one piece of code after another from the generator."""

    def __init__(self, rng: SplitMix64):
        self.rng = rng

    def name(self) -> str:
        r = self.rng
        return r.pick(NOUNS) if r.chance(60) else f"{r.pick(ADJECTIVES)}_{r.pick(NOUNS)}"

    def number(self) -> str:
        return str(self.rng.pick((0, 1, 2, 3, 4, 8, 10, 16, 32, 64, 100, 128, 256, 1024, 29500)))

    def atom(self, names: list[str]) -> str:
        r = self.rng
        roll = r.below(10)
        if roll < 5:
            return r.pick(names)
        if roll < 7:
            return self.number()
        if roll < 9:
            return f"{r.pick(BUILTINS)}({r.pick(names)})"
        return f"{r.pick(names)}[{r.pick(('0', '-1', 'i', '1:'))}]"

    def expr(self, names: list[str]) -> str:
        r = self.rng
        left = self.atom(names)
        return left if r.chance(30) else f"{left} {r.pick(OPERATORS)} {self.atom(names)}"

    def sentence(self) -> str:
        r = self.rng
        return f"{r.pick(VERBS)} the {r.pick(ADJECTIVES)} {r.pick(NOUNS)} {r.pick(PREPOSITIONS)} each {r.pick(NOUNS)}"

    def block(self, names: list[str], indent: str, depth: int) -> list[str]:
        r = self.rng
        lines: list[str] = []
        for _ in range(1 + r.below(4)):
            roll = r.below(10)
            if roll < 4 or depth >= 2 or roll == 8:
                if roll == 8:  # a comment says what the next line does (never a block of its own)
                    lines.append(f"{indent}# {self.sentence()}")
                target = self.name()
                lines.append(f"{indent}{target} = {self.expr(names)}")
                names = names + [target]
            elif roll < 6:
                item = r.pick(NOUNS)
                lines.append(f"{indent}for {item} in {r.pick(names)}:")
                lines += self.block(names + [item], indent + "    ", depth + 1)
            elif roll < 8:
                lines.append(f"{indent}if {r.pick(names)} {r.pick(COMPARISONS)} {self.atom(names)}:")
                lines += self.block(names, indent + "    ", depth + 1)
                if r.chance(40):
                    lines.append(f"{indent}else:")
                    lines += self.block(names, indent + "    ", depth + 1)
            else:
                lines.append(f"{indent}{r.pick(names)}.append({self.expr(names)})")
        return lines

    def function(self, indent: str = "", method: bool = False) -> list[str]:
        r = self.rng
        args = [self.name() for _ in range(1 + r.below(3))]
        args = list(dict.fromkeys(args))  # dict keeps insertion order: deterministic
        params = (["self"] if method else []) + args
        head = f"{indent}def {r.pick(VERBS)}_{r.pick(NOUNS)}({', '.join(params)}):"
        doc = f'{indent}    """{self.sentence().capitalize()}."""'
        body = self.block(args, indent + "    ", 0)
        return [head, doc, *body, f"{indent}    return {self.expr(args)}", ""]

    def klass(self) -> list[str]:
        r = self.rng
        name = f"{r.pick(ADJECTIVES).capitalize()}{r.pick(NOUNS).capitalize()}"
        fields = list(dict.fromkeys(self.name() for _ in range(1 + r.below(3))))
        lines = [f"class {name}:", f'    """The {r.pick(NOUNS)} of one {r.pick(NOUNS)}."""', "",
                 f"    def __init__(self, {', '.join(fields)}):"]
        lines += [f"        self.{f} = {f}" for f in fields] + [""]
        for _ in range(1 + r.below(2)):
            lines += self.function("    ", method=True)
        return lines + [""]


def generate(chars: int, seed: int = SEED) -> str:
    """The first `chars` characters of the corpus: functions and classes, one after another."""
    writer = _Writer(SplitMix64(seed))
    parts: list[str] = []
    total = 0
    while total < chars:
        lines = writer.klass() if writer.rng.chance(15) else writer.function()
        text = "\n".join(lines) + "\n"
        parts.append(text)
        total += len(text)
    return "".join(parts)[:chars]


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def build(chars: int) -> str:
    """The corpus, checked against its pin: whatever machine or Python made it, it is this text."""
    text = generate(max(chars, PINNED_CHARS))
    digest = sha256(text[:PINNED_CHARS])
    if digest != CORPUS_SHA256:
        raise SystemExit(f"error: the generated corpus has sha256 {digest}, not the pinned {CORPUS_SHA256}: "
                         "trainer/corpus.py was changed without updating CORPUS_SHA256")
    return text[:chars]
