"""DistributedDataParallel with the levers clusters tune, and the check that it kept its promise.

wrap_ddp sets the bucket size, the gradient communication hook and static graph; param_checksum
hashes a replica's weights, so ranks can compare theirs without shipping them around.
"""

import ctypes
import hashlib

from torch.nn.parallel import DistributedDataParallel as DDP


def wrap_ddp(model, c, bucket_cap_mb=25.0, comm_hook="none", static_graph=False, timer=None):
    """DDP with the levers clusters tune: bucket size, a gradient-compression hook, static graph.

    With a CommTimer, the hook (plain all-reduce for "none") is wrapped to time the communication.
    """
    if comm_hook == "bf16" and c.backend != "nccl":
        # torch's bf16_compress_hook is built on NCCL's bf16 all-reduce; gloo has none.
        raise SystemExit(f"error: --comm-hook bf16 needs CUDA and NCCL, and this run uses {c.backend}; "
                         "use fp16 or powersgd, or --backend nccl where every node has a GPU")
    ddp = DDP(model, device_ids=[c.local_rank] if c.device.type == "cuda" else None,
              bucket_cap_mb=bucket_cap_mb, static_graph=static_graph)
    register_comm_hook(ddp, comm_hook, timer)
    return ddp


def register_comm_hook(ddp, name, timer=None):
    """PyTorch's DDP communication hooks: https://pytorch.org/docs/stable/ddp_comm_hooks.html"""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    state, hook = None, None  # state None = the default process group
    if name == "none":
        hook = default_hooks.allreduce_hook if timer else None  # DDP's own all-reduce when untimed
    elif name == "fp16":
        hook = default_hooks.fp16_compress_hook
    elif name == "bf16":
        hook = default_hooks.bf16_compress_hook
    elif name == "powersgd":
        # Rank-1 approximation with error feedback; plain all-reduce for the first steps, as the
        # PowerSGD paper warms up.
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2)
        hook = powerSGD_hook.powerSGD_hook
    else:
        raise ValueError(f"unknown comm hook {name!r}")
    if hook is not None:
        ddp.register_comm_hook(state, timer.wrap(hook) if timer else hook)


def param_checksum(model):
    """First 16 hex chars of sha256 over every parameter's name, shape and bytes.

    Identical iff the replicas hold bit-identical weights, which is what DDP
    promises after every step. A sharded parameter (an FSDP2 DTensor) is gathered whole first: a
    collective, so every rank must call this, as every rank does.
    """
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        t = (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        # The tensor's raw bytes, read via ctypes so NumPy isn't required.
        h.update(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()))
    return h.hexdigest()[:16]
