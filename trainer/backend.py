"""Which collective backend a rank uses, and on which device: `--backend auto|nccl|gloo`.

Every rank of a job must pick the same backend, or rendezvous passes and the first collective
hangs. Left to itself (auto) each rank picks nccl where CUDA is available and gloo elsewhere, which
splits a lab that mixes GPU and CPU nodes; so the default comes from $DDPLAB_BACKEND, which
`labctl up` writes into every node's env file of such a lab, and only then from the node itself.

gloo on a CUDA machine trains on the CPU: gloo can all-reduce CUDA tensors, but through host
copies, and a GPU node that computes on its GPU while its peers wait on CPU only skews the
comparison. The choice and its reason are printed at start-up.
"""

from __future__ import annotations

import argparse
import os
from typing import NamedTuple

BACKENDS = ("auto", "nccl", "gloo")
ENV_VAR = "DDPLAB_BACKEND"


class Choice(NamedTuple):
    backend: str  # "nccl" or "gloo"
    device_type: str  # "cuda" or "cpu"
    reason: str  # one phrase: why this backend, for the start-up line


def backend_flag(text: str) -> str:
    """argparse type of --backend (its default, $DDPLAB_BACKEND, passes through here too)."""
    value = text.strip().lower()
    if value not in BACKENDS:
        raise argparse.ArgumentTypeError(
            f"expected one of {', '.join(BACKENDS)}, got {text!r}")
    return value


def default_backend() -> str:
    """--backend's default: $DDPLAB_BACKEND when set, else auto."""
    return os.environ.get(ENV_VAR, "").strip() or "auto"


def resolve(requested: str | None, cuda_available: bool, nccl_available: bool = True, from_env: bool = False) -> Choice:
    """The backend and device for `requested` on a machine with or without CUDA (pure: the tests
    pass the machine's answers); None is --backend's default (see default_backend). An impossible request is a SystemExit that says what to do."""
    if requested is None:  # the flag not given: the lab's word, else the machine's
        requested, from_env = default_backend(), ENV_VAR in os.environ and bool(os.environ[ENV_VAR].strip())
        requested = requested.lower()
    given = f"{ENV_VAR}={requested}" if from_env else f"--backend {requested}"
    if requested == "auto":
        if cuda_available and nccl_available:
            return Choice("nccl", "cuda", "auto: CUDA is available")
        return Choice("gloo", "cpu", "auto: no CUDA device" if not cuda_available else "auto: torch has no NCCL")
    if requested == "gloo":
        why = f"{given}, CPU tensors" + (" although CUDA is available" if cuda_available else "")
        return Choice("gloo", "cpu", why)
    if requested == "nccl":
        if not cuda_available:
            raise SystemExit(f"error: {given} needs a CUDA GPU, and this torch sees none "
                             "(a CPU build, or no device visible: check nvidia-smi and CUDA_VISIBLE_DEVICES); "
                             "use --backend gloo, or auto")
        if not nccl_available:
            raise SystemExit(f"error: {given}, but this torch build has no NCCL; use --backend gloo")
        return Choice("nccl", "cuda", given)
    raise SystemExit(f"error: {ENV_VAR} must be one of {', '.join(BACKENDS)}, got {requested!r}" if from_env
                     else f"error: --backend must be one of {', '.join(BACKENDS)}, got {requested!r}")
