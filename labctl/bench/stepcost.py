"""`labctl cost --step`: the trainer's step model (trainer/stepmodel.py) asked about fabrics the lab
cannot have: a whole optimizer step's predicted time on each link, with the formula's terms.

The compute of one micro-step is given (`--compute-s`) or derived from a FLOP rate by the usual rule
for a transformer: forward and backward take 6 x parameters x tokens FLOPs, backward two thirds of
it (`--flops RATE --tokens N`, N the tokens of one rank's micro-step). DDP's gradients go in
buckets of `--bucket-cap-mb`, cut from the gradient bytes in the order backward produces them,
backward's time spread evenly over them, as in the trainer's own prediction. Each link's rate is
taken at --efficiency and its latency per hop is the link's alpha (plus --delay).
"""

from __future__ import annotations

from dataclasses import dataclass

from labctl.bench.cost import DTYPE_BYTES, CostQuery, CostReport, Link, check_query, report_of, resolve
from labctl.session import LabSession
from labctl.errors import ConfigError
from trainer import stepmodel

BACKWARD_SHARE = 2 / 3  # of forward + backward: the backward pass does twice the forward's FLOPs
FLOPS_PER_PARAM_TOKEN = 6  # forward 2, backward 4, per parameter and token


@dataclass(frozen=True)
class StepQuery:
    """What a step is made of, beside `labctl cost`'s CostQuery: the compute and the buckets."""

    compute_s: float | None = None  # --compute-s: forward + backward of one micro-step
    flops: float | None = None  # --flops: the FLOP rate one rank reaches
    tokens: float | None = None  # --tokens: tokens in one rank's micro-step
    optimizer_s: float = 0.0  # --optimizer-s
    bucket_cap_mb: float = 25.0  # --bucket-cap-mb


def step_query(step: bool, compute_s: float | None, flops: float | None = None, tokens: float | None = None,
               optimizer_s: float | None = None, bucket_cap_mb: float | None = None) -> StepQuery | None:
    """`labctl cost`'s --step options as a StepQuery; None without --step, where they are refused."""
    if not step:
        for key, value in (("--flops", flops), ("--tokens", tokens), ("--optimizer-s", optimizer_s),
                           ("--bucket-cap-mb", bucket_cap_mb)):
            if value is not None:
                raise ConfigError(key, value, "prices a whole step: it needs --step",
                                  hint=f"labctl cost --params 760e6 --nodes 2 --step {key} ...")
        return None
    return StepQuery(compute_s, flops, tokens, optimizer_s or 0.0, 25.0 if bucket_cap_mb is None else bucket_cap_mb)


def micro_step_s(params: float, step: StepQuery) -> tuple[float, str]:
    """(seconds of one micro-step's forward and backward, how it was found)."""
    if step.compute_s is not None and (step.flops is not None or step.tokens is not None):
        raise ConfigError("--compute-s", step.compute_s, "gives the compute, and so do --flops and --tokens: give one",
                          hint="drop --flops and --tokens, or --compute-s")
    if step.compute_s is not None:
        if not step.compute_s > 0:
            raise ConfigError("--compute-s", step.compute_s, "must be a positive number of seconds")
        return step.compute_s, "given"
    if step.flops is None and step.tokens is None:
        raise ConfigError("--step", True, "needs the compute of one micro-step",
                          hint="add --compute-s 0.5, or --flops 400e12 --tokens 8192 (6 x params x tokens / FLOP rate)")
    for key, value in (("--flops", step.flops), ("--tokens", step.tokens)):
        if value is None or not value > 0:
            raise ConfigError(key, value, "must be a positive number, given with the other of --flops and --tokens",
                              hint="--flops 400e12 --tokens 8192: a rank at 400 TFLOP/s, 8192 tokens a micro-step")
    flops = FLOPS_PER_PARAM_TOKEN * params * step.tokens
    return flops / step.flops, f"6 x {params:g} params x {step.tokens:g} tokens / {step.flops:g} FLOP/s"


def buckets(payload: float, cap_mb: float) -> tuple[int, ...]:
    """The gradient bytes cut into DDP's buckets of `cap_mb` MiB (the last one the remainder)."""
    if not cap_mb > 0:
        raise ConfigError("--bucket-cap-mb", cap_mb, "must be a positive number of MiB")
    cap = int(cap_mb * 2**20)
    full, rest = divmod(int(payload), cap)
    return (cap,) * full + ((rest,) if rest else ())


def estimate_step(query: CostQuery, step: StepQuery, lab: LabSession | None = None) -> CostReport:
    """`labctl cost --step`: `query` resolved and checked as `labctl cost` does, a predicted step a link."""
    n, links = resolve(query, lab)
    check_query(query, n)
    return report_of(query, n, step_rows(query, n, links, step), step=True)


def step_rows(query: CostQuery, n: int, links: list[Link], step: StepQuery) -> list[dict]:
    """One predicted step per link over n ranks: its terms in seconds. `query` is `labctl cost`'s
    (the parameters and their dtype, the strategy, backend, accumulation, efficiency, ranks a node)."""
    compute_s, source = micro_step_s(query.params, step)
    payload = query.params * DTYPE_BYTES[query.dtype]
    compute = stepmodel.Compute(compute_s * (1 - BACKWARD_SHARE) * 1e3, compute_s * BACKWARD_SHARE * 1e3,
                                step.optimizer_s * 1e3)
    # fsdp's units: the model as one block whose gathers and scatter the step model counts
    job = stepmodel.Job(world=n, strategy=query.strategy or "ddp", backend=query.backend, accum=query.grad_accum,
                        buckets=buckets(payload, step.bucket_cap_mb), param_bytes=int(payload),
                        units=(int(payload), 0), local_world=query.nproc_per_node)
    rows = []
    for link in links:
        modelled = stepmodel.Link(link.rate_bps * query.efficiency, stack_s=link.alpha_s)
        p = stepmodel.predict(job, compute, modelled)
        rows.append({"link": link.name, "rate_bps": link.rate_bps, "payload_bytes": payload, "compute_from": source,
                     "predicted_step_s": p.step_ms / 1e3, "compute_s": p.compute_ms / 1e3,
                     "comm_s": p.comm_ms / 1e3, "exposed_comm_s": p.exposed_comm_ms / 1e3,
                     "optimizer_s": p.optimizer_ms / 1e3, "buckets": len(job.buckets),
                     "terms_s": {k: v / 1e3 for k, v in p.terms.items()}})
    return rows
