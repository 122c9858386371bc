"""The benchmarks and the cost model, as `labctl bench` and `labctl cost` run them and a script may:
each measures on a `Lab` (or, for `bench_up` and `bench_start`, on labs of its own) and returns the
report its command renders. `estimate`, `scaling` and `straggler` take their command's options as one
object: a CostQuery, ScalingOptions or StragglerOptions."""

from __future__ import annotations

from labctl.bench.allreduce import measure as allreduce
from labctl.bench.allreduce import measure_collectives as collectives
from labctl.bench.bringup import bench_up
from labctl.bench.cost import CostQuery, estimate, parse_params
from labctl.bench.stepcost import StepQuery, estimate_step, step_query
from labctl.bench.predict import measure as predict
from labctl.bench.scaling_run import ScalingOptions
from labctl.bench.scaling_run import measure as scaling
from labctl.bench.startup import measure as bench_start
from labctl.bench.straggler import StragglerOptions
from labctl.bench.straggler import measure as straggler
from labctl.run.userenv import NCCL_DEBUG_ENV

__all__ = ["allreduce", "collectives", "bench_start", "bench_up", "estimate", "predict", "parse_params", "scaling", "straggler", "NCCL_DEBUG_ENV",
           "CostQuery", "StepQuery", "estimate_step", "step_query", "ScalingOptions", "StragglerOptions"]
