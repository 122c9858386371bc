"""`labctl cost --step`: the trainer's step model (trainer/stepmodel.py) asked about fabrics the lab
cannot have: a whole optimizer step's predicted time on each link, with the formula's terms.

The compute of one micro-step is given (`--compute-s`) or derived from a FLOP rate by the usual rule
for a transformer: forward and backward take 6 x parameters x tokens FLOPs, backward two thirds of
it (`--flops RATE --tokens N`, N the tokens of one rank's micro-step). DDP's gradients go in
buckets of `--bucket-cap-mb`, cut from the gradient bytes in the order backward produces them,
backward's time spread evenly over them, as in the trainer's own prediction. Each link's rate is
taken at --efficiency, its stack's latency per hop is the link's alpha, and --delay is a delay per
hop that no transfer hides, as the calibrated model has it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from labctl.bench.cost import DTYPE_BYTES, CostQuery, CostReport, Link, check_query, links_to_price, report_of, resolve
from labctl.run.result import RESULT_FILE
from labctl.session import LabSession
from labctl.errors import ConfigError, StateError
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
    if query.strategy in ("pp", "tp"):
        raise ConfigError("--step", True, f"predicts with the trainer's step model, which does not know "
                          f"--strategy {query.strategy} yet", hint=f"leave out --step: --strategy {query.strategy} "
                          "with --compute-s prices its whole step by hand")
    n, links, notes = resolve(query, lab)
    check_query(query, n)
    return report_of(query, n, step_rows(query, n, links, step), step=True, notes=notes)


def step_rows(query: CostQuery, n: int, links: list[Link], step: StepQuery) -> list[dict]:
    """One predicted step per link over n ranks: its terms in seconds. `query` is `labctl cost`'s
    (the parameters and their dtype, the strategy, backend, accumulation, efficiency, ranks a node)."""
    compute_s, source = micro_step_s(query.params, step)
    payload = query.params * DTYPE_BYTES[query.dtype]
    compute = stepmodel.ComputeTimes(compute_s * (1 - BACKWARD_SHARE) * 1e3, compute_s * BACKWARD_SHARE * 1e3,
                                step.optimizer_s * 1e3)
    # fsdp's units: the model as one block whose gathers and scatter the step model counts
    job = stepmodel.Job(world=n, strategy=query.strategy or "ddp", backend=query.backend, accum=query.grad_accum,
                        buckets=buckets(payload, step.bucket_cap_mb), param_bytes=int(payload),
                        units=(int(payload), 0), local_world=query.nproc_per_node)
    return [step_row(job, compute, replace(link, rate_bps=link.rate_bps * query.efficiency), link.rate_bps, source)
            for link in links]


def step_row(job: stepmodel.Job, compute: stepmodel.ComputeTimes, link: Link, rate_bps: float, source: str) -> dict:
    """One predicted step on `link` (its rate as the model takes it), its terms in seconds; `rate_bps`
    the link's rate as shown."""
    p = stepmodel.predict(job, compute, link)
    return {"link": link.name, "rate_bps": rate_bps, "payload_bytes": job.param_bytes, "compute_from": source,
            "predicted_step_s": p.step_ms / 1e3, "compute_s": p.compute_ms / 1e3,
            "comm_s": p.comm_ms / 1e3, "exposed_comm_s": p.exposed_comm_ms / 1e3,
            "optimizer_s": p.optimizer_ms / 1e3, "buckets": len(job.buckets),
            "terms_s": {k: v / 1e3 for k, v in p.terms.items()}}


# ------------------------------------------------------------------------- cost --from-run

OWN_LINK = "this run's link"  # the first row of `cost --from-run`: the link as the run calibrated it


def run_inputs(run_dir: Path) -> dict:
    """The step model's inputs from the SUMMARY in `run_dir`'s result.json. StateError where the run is
    not over, printed no SUMMARY, or predicted nothing (a script of its own, or an older trainer)."""
    try:
        result = json.loads((run_dir / RESULT_FILE).read_text())
    except (OSError, ValueError):
        result = None
    if not isinstance(result, dict):
        raise StateError(f"run {run_dir.name} has no {RESULT_FILE} (it is still running, or its folder is not a run's)",
                         hint="labctl cost --from-run RUN once the run has ended")
    summary = result.get("summary") or {}
    inputs = (summary.get("step_model") or {}).get("inputs") if isinstance(summary, dict) else None
    if isinstance(summary, dict) and summary.get("strategy") == "pp":
        raise StateError(f"run {run_dir.name} is a pipeline: its step was played out from its own stages' times "
                         "(trainer/pipepredict.py), which --from-run does not price on other links",
                         hint="labctl cost --strategy pp --activations B,S,H --layers L prices a pipeline on any link")
    if not inputs:
        raise StateError(f"run {run_dir.name} has no step model to price: only the trainer's runs (python -m trainer) "
                         "predict their steps (and a trainer older than this labctl kept no inputs)",
                         hint="labctl run -- -m trainer --epochs 3, then labctl cost --from-run")
    return inputs


def run_rows(inputs: dict, links: list[Link], efficiency: float) -> list[dict]:
    """The run's own step (its model, buckets, compute and world, as its prediction took them) priced
    on its own link first, as the run did (the same number as its SUMMARY's predicted_step_ms), then
    on each of `links` at `efficiency` of its rate (no burst, the ring as even as the link)."""
    job, compute, own = stepmodel.from_record(inputs)
    source = f"calibrated by the run, {job.world} ranks"
    rows = [step_row(job, compute, replace(own, name=OWN_LINK), own.rate_bps, source)] if own else []
    return rows + [step_row(job, compute, replace(link, rate_bps=link.rate_bps * efficiency), link.rate_bps, source)
                   for link in links]


def estimate_run(run_dir: Path, query: CostQuery) -> CostReport:
    """`labctl cost --from-run RUN`: run_rows on the links `query` names (none: every preset), with its
    --delay and --efficiency; the report says what the run was (its strategy, ranks, accumulation)."""
    inputs = run_inputs(run_dir)
    links = links_to_price(query.links, None, query.delay)
    try:
        rows, job = run_rows(inputs, links, query.efficiency), inputs["job"]
    except (KeyError, TypeError, AttributeError):
        raise StateError(f"run {run_dir.name}'s step model inputs are not as this labctl writes them",
                         hint="run the trainer again with this checkout, then labctl cost --from-run") from None
    asked = replace(query, params=job["param_bytes"] / DTYPE_BYTES["fp32"], dtype="fp32", strategy=job["strategy"],
                    backend=job["backend"], grad_accum=job["accum"], nproc_per_node=job["local_world"])
    return report_of(asked, job["world"], rows, step=True, run=run_dir.name)
