"""A small character-level GPT and its corpus: Python-like source text (trainer/corpus.py).

The model follows nanoGPT (github.com/karpathy/nanoGPT) cut to the bone: token and position
embeddings, pre-norm blocks of causal self-attention and an MLP, a tied output head. Tiny by
default (2 layers, 64 wide, ~110K parameters) so a step takes tens of milliseconds on one CPU
core, yet it has the shape of the real thing: its gradients are what DDP all-reduces.

The corpus needs no network and no file: it is generated from a fixed seed, byte for byte the
same on every machine and Python, and pinned by its sha256. Rank 0 prepares it once into the data
directory (a shared volume in the lab) with an atomic rename, every rank waits at a barrier, then
all read the same file and check its hash agrees.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from trainer import corpus as corpus_mod


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int):
        super().__init__()
        self.head_dim = n_embd // n_head
        self.ln1 = nn.LayerNorm(n_embd)
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.ln2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        b, t, _ = x.shape
        # q, k and v side by side; under tensor parallelism (trainer/tensorparallel.py) only this rank's
        # heads' q, k and v, whose rows it holds
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=2)
        # [b, t, heads x head_dim] -> [b, heads, t, head_dim]: every head, or this rank's
        q, k, v = (z.view(b, t, -1, self.head_dim).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, -1))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_embd: int, n_head: int):
        super().__init__()
        if n_embd % n_head:
            raise ValueError(f"--n-embd {n_embd} is not divisible by --n-head {n_head}")
        self.block_size = block_size
        self.tok = nn.Embedding(vocab_size, n_embd)
        self.pos = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)
        self.head.weight = self.tok.weight  # weight tying, as GPT-2
        self.apply(self._init)

    @staticmethod
    def _init(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))  # logits, [batch, t, vocab]


# ------------------------------------------------------------------------------ corpus

def encode(corpus: str) -> dict:
    """{'vocab': sorted characters, 'tokens': uint8/int16 tensor, 'sha256': hash of the text}."""
    vocab = sorted(set(corpus))
    index = {ch: i for i, ch in enumerate(vocab)}
    dtype = torch.uint8 if len(vocab) <= 256 else torch.int16
    tokens = torch.tensor([index[ch] for ch in corpus], dtype=dtype)
    return {"vocab": vocab, "tokens": tokens, "sha256": corpus_mod.sha256(corpus)}


def corpus_path(data_dir: Path, max_chars: int) -> Path:
    # Named by the pinned hash: a data dir that holds a corpus made by another version of
    # trainer/corpus.py (a shared volume, ~/.cache) never hands it to this one.
    return Path(data_dir) / f"corpus-{corpus_mod.CORPUS_SHA256[:12]}-{max_chars}.pt"


def prepare_corpus(data_dir: Path, max_chars: int) -> Path:
    """Write the encoded corpus once, atomically: a reader never sees a half-written file."""
    path = corpus_path(data_dir, max_chars)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        torch.save(encode(corpus_mod.build(max_chars)), f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)  # atomic on POSIX: the file appears whole or not at all
    return path


def load_corpus(path: Path) -> dict:
    return torch.load(path, weights_only=True)


class TextWindows:
    """Sample i is the window tokens[i : i+T+1]: inputs are the first T, targets the last T."""

    def __init__(self, tokens: torch.Tensor, block_size: int):
        if len(tokens) <= block_size + 1:
            raise SystemExit(f"error: the corpus has {len(tokens)} tokens, too few for --block-size {block_size}")
        self.tokens = tokens.long()
        self.block_size = block_size
        self.n_samples = len(tokens) - block_size

    def batch(self, indices: torch.Tensor):
        offsets = indices.unsqueeze(1) + torch.arange(self.block_size + 1)
        window = self.tokens[offsets]
        return window[:, :-1], window[:, 1:]


def param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
