"""The benchmarks and the cost model, as `labctl bench` and `labctl cost` run them and a script may:
each measures on a `Lab` (or, for `bench_up` and `bench_start`, on labs of its own) and returns the
report its command renders. `estimate`, `scaling` and `straggler` take their command's options as one
object: a CostQuery, ScalingOptions or StragglerOptions."""

from __future__ import annotations

from labctl.bench.allreduce import measure as allreduce
from labctl.bench.allreduce import measure_collectives as collectives
from labctl.bench.bringup import bench_up
from labctl.bench import cost
from labctl.bench.cost import CostQuery, CostReport, parse_params
from labctl.bench.parallelrows import PARALLEL, estimate_parallel
from labctl.bench.stepcost import StepQuery, estimate_run, estimate_step, step_query
from labctl.bench.predict import measure as predict
from labctl.bench.scaling_run import ScalingOptions
from labctl.bench.scaling_run import measure as scaling
from labctl.bench.startup import measure as bench_start
from labctl.bench.straggler import StragglerOptions
from labctl.bench.straggler import measure as straggler
from labctl.errors import ConfigError
from labctl.run.userenv import NCCL_DEBUG_ENV
from labctl.session import LabSession
from labctl.trace import find_run

__all__ = ["allreduce", "collectives", "bench_start", "bench_up", "estimate", "predict", "parse_params", "scaling", "straggler", "NCCL_DEBUG_ENV",
           "CostQuery", "StepQuery", "estimate_step", "step_query", "cost_of_run", "ScalingOptions", "StragglerOptions"]


def estimate(query: CostQuery, lab: LabSession | None = None) -> CostReport:
    """`labctl cost`: what one gradient synchronisation, or one optimizer step of a strategy, costs on
    each link (labctl/bench/cost.py; pp and tp in labctl/bench/parallelrows.py)."""
    return estimate_parallel(query, lab) if query.strategy in PARALLEL else cost.estimate(query, lab)


def cost_of_run(session: LabSession, run: str, query: CostQuery, given: dict) -> CostReport:
    """`labctl cost --from-run RUN`: the run's own step priced again, on its link and on the links
    `query` names (estimate_run). RUN: a run id of the lab's, or a run folder. `given`: the options
    that describe a model or a step, by flag, which the run gives instead (one given is refused)."""
    for flag, value in given.items():
        if value not in (None, False):
            raise ConfigError(flag, value, "describes the model or its step, which --from-run takes from the run",
                              hint=f"labctl cost --from-run {run} --link 10GbE")
    return estimate_run(find_run(session.directory, run), query)
