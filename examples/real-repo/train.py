"""A character-level GPT trained the way public repositories write it (nanoGPT's train.py): settings
as globals that `--key=value` overrides, DDP whenever torchrun's variables are set, the data
prepared once by rank 0 while the others wait at a barrier, `torch.compile` on request. It is ours,
in that style, so that the docs can run it offline: docs/how-to/real-repository.md brings it to
the lab step by step.

    python train.py                               # one process, on a GPU if there is one
    torchrun --standalone --nproc_per_node=2 train.py --max_iters=50
    labctl run -- examples/real-repo/train.py --compile=True

Two settings put back what the original does on a GPU cluster, to see what the lab makes of it:
`--cpu_patch=False` (NCCL and `torch.cuda.set_device` on every rank) and `--shard_grads=True` (the
gradients averaged with `reduce_scatter_tensor(..., async_op=True).get_future()`, as ZeRO-style
optimizers written for NCCL do).
"""

import ast
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm  # requirements.txt: not in the node image

# -------------------------------------------------------------------------------------- settings
data_dir = "data/real-repo"  # relative to the working directory: on the lab, the shared workspace
max_iters = 20
eval_interval = 10
batch_size = 8
block_size = 32
n_layer = 2
n_head = 4
n_embd = 64
learning_rate = 3e-3
seed = 1337
compile = False
cpu_patch = True  # the five lines that pick the backend and the device from what the node has
shard_grads = False
for arg in sys.argv[1:]:  # nanoGPT's configurator, without its exec: --key=value over a global above
    key, _, value = arg.removeprefix("--").partition("=")
    if key not in globals() or key.startswith("_") or not value:
        sys.exit(f"train.py: unknown setting {arg!r}: say --key=value for one of the settings at the top")
    try:
        globals()[key] = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        globals()[key] = value  # a string, as --data_dir=data/other

# ---------------------------------------------------------------------------- processes and device
ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    rank, local_rank, world_size = (int(os.environ[key]) for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
if ddp and cpu_patch:
    device = f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
    dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
elif ddp:  # as the original has it: a GPU per rank, NCCL between them
    dist.init_process_group(backend="nccl")
    device = f"cuda:{local_rank}"
    torch.cuda.set_device(device)
else:
    rank, local_rank, world_size = 0, 0, 1
    device = "cuda" if torch.cuda.is_available() else "cpu"
master = rank == 0
torch.manual_seed(seed)


def say(message):
    if master:
        print(message, flush=True)


# ------------------------------------------------------------------------------------------- data
def prepare(folder):
    """data/.../train.pt and val.pt from input.txt, as nanoGPT's prepare.py makes its .bin files: a
    character vocabulary, 90% to train on. Without an input.txt, the text is this example's README
    (the docs' runs are offline)."""
    os.makedirs(folder, exist_ok=True)
    source = os.path.join(folder, "input.txt")
    if not os.path.exists(source):
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "README.md")) as f:
            text = f.read()
        with open(source, "w") as f:
            f.write(text)
    with open(source) as f:
        text = f.read()
    chars = sorted(set(text))
    ids = torch.tensor([chars.index(c) for c in text], dtype=torch.long)
    cut = int(0.9 * len(ids))
    torch.save({"ids": ids[:cut], "vocab": len(chars)}, os.path.join(folder, "train.pt"))
    torch.save({"ids": ids[cut:], "vocab": len(chars)}, os.path.join(folder, "val.pt"))
    return len(text), len(chars)


if master and not os.path.exists(os.path.join(data_dir, "train.pt")):
    chars, vocab = prepare(data_dir)
    say(f"rank 0 prepared {data_dir}: {chars:,} characters, a vocabulary of {vocab}")
if ddp:
    dist.barrier()  # the others wait here until rank 0 has written the files
train, val = (torch.load(os.path.join(data_dir, f"{split}.pt")) for split in ("train", "val"))
vocab_size = train["vocab"]
generator = torch.Generator().manual_seed(seed + rank)  # each rank its own batches


def batch(split):
    ids = (train if split == "train" else val)["ids"]
    starts = torch.randint(len(ids) - block_size - 1, (batch_size,), generator=generator)
    x = torch.stack([ids[s:s + block_size] for s in starts])
    y = torch.stack([ids[s + 1:s + 1 + block_size] for s in starts])
    return x.to(device), y.to(device)


# ------------------------------------------------------------------------------------------ model
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.qkv, self.proj = nn.Linear(n_embd, 3 * n_embd), nn.Linear(n_embd, n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(n_embd, dim=2)
        q, k, v = (z.view(b, t, n_head, c // n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab_size, n_embd), nn.Embedding(block_size, n_embd)
        self.blocks = nn.Sequential(*[Block() for _ in range(n_layer)])
        self.ln, self.head = nn.LayerNorm(n_embd), nn.Linear(n_embd, vocab_size)

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        logits = self.head(self.ln(self.blocks(x)))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


model = GPT().to(device)
say(f"{sum(p.numel() for p in model.parameters()):,} parameters, {world_size} rank(s) on {device}")
if compile:
    say("compiling the model... (takes a while the first time)")
    model = torch.compile(model)  # nanoGPT's order: compile, then wrap in DDP
if ddp and not shard_grads:
    model = DDP(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)


def average_gradients_sharded():
    """Each rank's gradients averaged the way sharded optimizers written for NCCL do: a reduce-scatter
    per parameter, its future awaited (gloo's reduce-scatter gives no future: the lab explains)."""
    pending = []
    for p in model.parameters():
        flat = p.grad.reshape(-1)
        full = torch.cat([flat, flat.new_zeros((-flat.numel()) % world_size)])
        shard = full.new_empty(full.numel() // world_size)
        work = dist.reduce_scatter_tensor(shard, full, op=dist.ReduceOp.AVG, async_op=True)
        pending.append((p, full, shard, work.get_future()))
    for p, full, shard, future in pending:
        future.wait()
        dist.all_gather_into_tensor(full, shard)  # every rank's averaged shards back into its gradient
        p.grad.copy_(full[:p.grad.numel()].view_as(p.grad))


# ------------------------------------------------------------------------------------------- loop
started = time.perf_counter()
for it in tqdm(range(max_iters + 1), disable=not (master and sys.stderr.isatty())):  # a bar on a terminal
    if it % eval_interval == 0:
        model.eval()
        with torch.no_grad():
            loss = model(*batch("val"))
        if ddp:
            dist.all_reduce(loss, op=dist.ReduceOp.SUM)
            loss /= world_size
        say(f"step {it}: val loss {loss.item():.4f}")
        model.train()
    if it == max_iters:
        break
    loss = model(*batch("train"))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if ddp and shard_grads:
        average_gradients_sharded()
    optimizer.step()
    if it == 0 and compile:  # the first evaluation and the first step each compiled a graph
        say(f"compiled: the first evaluation and step took {time.perf_counter() - started:.1f} s")
say(f"{max_iters} steps in {time.perf_counter() - started:.1f} s")
if ddp:
    dist.destroy_process_group()
