"""Where a step's time goes: compute, gradient communication, and waiting for the slowest rank.

DDP all-reduces gradients in buckets from inside backward(): when every gradient of a bucket is
ready, it hands the bucket to the communication hook and carries on computing the next ones; at
the end, backward() blocks until every bucket's all-reduce has finished. CommTimer wraps the hook
(DDP's default all-reduce, or the chosen compression hook) and notes when each bucket is handed
over and when its result comes back. Per step that gives:

  comm_ms       first bucket handed over -> last all-reduce finished: time the collective was busy
                (overlapped with backward compute for all but the last bucket).
  comm_wait_ms  last bucket handed over -> backward() returned: time this rank sat idle waiting
                for communication, including waiting for a slower rank to contribute its share.
  compute_ms    the step's forward and backward time minus comm_wait_ms.
  step_ms       the whole optimizer step (forward, backward, communication, optimizer), wall clock.
  wall_ms       end of the previous step -> end of this one: step_ms plus data loading and logging.
                Throughput (tokens/s) is computed from wall_ms, so nothing is left out.

A rank that computes slower arrives last at every all-reduce, so the others' comm_wait_ms holds
the time they waited for it; summarize() names that rank and how long the others waited.

For a timeline across ranks every step also carries absolute times (t_start, t_comm_start,
t_comm_end, t_backward_end, t_end) in unix seconds, from one clock per process: time.time() and
time.perf_counter() sampled once, at import, then wall(p) = WALL0 + (p - PERF0). I want both
properties at once: perf_counter's resolution and steadiness within a process (time.time() can
step when NTP adjusts it mid-run), and a shared origin across processes and machines, which only
the wall clock has. How far two machines' wall clocks disagree is for the reader to correct, from
the "clock" records that every rank writes just after a barrier (trainer/metrics.py).
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import asdict, dataclass, field

from trainer.collectives import in_flight_ms, records

# Sampled once, when the trainer starts (train.py imports this module first thing).
WALL0, PERF0 = time.time(), time.perf_counter()


def wall(perf: float | None) -> float | None:
    """A time.perf_counter() value on this process's one clock, in unix seconds; None stays None
    (a step without communication has no comm times)."""
    if perf is None:
        return None
    return WALL0 + (perf - PERF0)


def wall_now() -> float:
    """Now, on this process's one clock, in unix seconds."""
    return wall(time.perf_counter())


class CommTimer:
    def __init__(self):
        self._lock = threading.Lock()  # result callbacks run on the backend's threads
        self.reset()

    def reset(self):
        with self._lock:
            self.first_launch = self.last_launch = self.last_done = None
            self.buckets = 0

    def wrap(self, hook):
        """A DDP comm hook that times `hook` (signature hook(state, bucket) -> Future)."""

        def timed(state, bucket):
            now = time.perf_counter()
            with self._lock:
                if self.first_launch is None:
                    self.first_launch = now
                self.last_launch = now
                self.buckets += 1

            def done(fut):
                with self._lock:
                    self.last_done = time.perf_counter()
                return fut.value()

            return hook(state, bucket).then(done)

        return timed

    def comm_ms(self) -> float:
        if self.first_launch is None or self.last_done is None:
            return 0.0
        return (self.last_done - self.first_launch) * 1e3

    def wait_ms(self, backward_end: float) -> float:
        if self.last_launch is None:
            return 0.0
        return max(0.0, backward_end - self.last_launch) * 1e3


@dataclass
class StepTiming:
    step: int
    compute_ms: float
    comm_ms: float
    comm_wait_ms: float
    step_ms: float
    tokens: int  # over all ranks
    wall_ms: float = 0.0
    # unix seconds on the process's one clock (see wall()); the comm pair is None without communication
    t_start: float | None = None  # before zero_grad
    t_comm_start: float | None = None  # the first gradient bucket handed to the collective
    t_comm_end: float | None = None  # the last all-reduce finished
    t_backward_end: float | None = None  # backward() returned (after the device sync)
    t_end: float | None = None  # after the optimizer step
    collectives: list = field(default_factory=list)  # the step's trainer.collectives.Call, in launch order
    pipeline: list = field(default_factory=list)  # --strategy pp: this stage's [forward|backward, micro, t0, t1]

    def record(self) -> dict:
        """The timing fields for a metrics line (the caller writes the step number): durations to
        the microsecond (3 decimals of ms), absolute times to the microsecond (6 decimals of s)."""
        out = {}
        for k, v in asdict(self).items():
            if k not in ("step", "collectives", "pipeline"):
                out[k] = round(v, 6 if k.startswith("t_") else 3) if isinstance(v, float) else v
        out["tokens_per_s"] = round(self.tokens / (self.wall_ms / 1e3), 1) if self.wall_ms else None
        if self.collectives:
            out["collectives"] = records(self.collectives, wall)
        if self.pipeline:
            out["pipeline"] = self.pipeline
        return out


def steady(steps: list) -> list:
    """Drop step 1 (DDP builds its buckets, the allocator warms up) when there is more to go on."""
    return steps[1:] if len(steps) > 1 else steps


def deciles(values: list[float]) -> tuple[float, float]:
    """(10th, 90th percentile) of `values` (statistics.quantiles, inclusive); one value: it, twice."""
    if len(values) < 2:
        return values[0], values[0]
    cut = statistics.quantiles(values, n=10, method="inclusive")
    return cut[0], cut[-1]


def summarize(per_rank: list[list[StepTiming]], hosts: list[str]) -> dict:
    """Run-wide figures from every rank's step timings (index = rank), steady steps only.

    tokens_per_s          global tokens / summed wall time of rank 0's steps.
    compute_ms_per_step   mean over steps of the slowest rank's compute: the critical path.
    allreduce_ms_per_step mean over steps of the smallest comm_ms over ranks: the rank that arrives
                          last at the all-reduce waits for nobody, so its comm_ms is the transfer.
    comm_fraction         mean over ranks of comm_wait / step time.
    slowest_rank          the rank with the most compute time; waited_for_slowest_s is the mean,
                          over the other ranks, of how much less compute they did: time they spent
                          waiting for it.
    """
    runs = [steady(steps) for steps in per_rank]
    n_steps = min(len(r) for r in runs)
    runs = [r[:n_steps] for r in runs]
    if n_steps == 0:
        return {}
    wall_s = sum(t.wall_ms for t in runs[0]) / 1e3
    tokens = sum(t.tokens for t in runs[0])
    compute_totals = [sum(t.compute_ms for t in r) for r in runs]
    slowest = max(range(len(runs)), key=lambda r: compute_totals[r])
    others = [r for r in range(len(runs)) if r != slowest]
    waited_s = statistics.fmean(compute_totals[slowest] - compute_totals[r] for r in others) / 1e3 if others else 0.0
    median_compute = statistics.median(compute_totals)
    return {
        "tokens_per_s": round(tokens / wall_s, 1) if wall_s else None,
        "step_ms": round(statistics.fmean(t.step_ms for t in runs[0]), 3),
        **dict(zip(("step_ms_p10", "step_ms_p90"), (round(v, 3) for v in deciles([t.step_ms for t in runs[0]])))),
        "compute_ms_per_step": round(statistics.fmean(max(r[i].compute_ms for r in runs) for i in range(n_steps)), 3),
        "allreduce_ms_per_step": round(statistics.fmean(min(r[i].comm_ms for r in runs) for i in range(n_steps)), 3),
        "comm_fraction": round(statistics.fmean(
            sum(t.comm_wait_ms for t in r) / max(sum(t.step_ms for t in r), 1e-9) for r in runs), 4),
        "slowest_rank": slowest,
        "slowest_node": hosts[slowest] if slowest < len(hosts) else None,
        "slowest_compute_ratio": round(compute_totals[slowest] / median_compute, 3) if median_compute else None,
        "waited_for_slowest_s": round(waited_s, 3),
        "measured_steps": n_steps,
    }


def straggler_line(summary: dict, threshold: float = 1.2) -> str | None:
    """One sentence naming the straggler, when one rank computes notably slower than the median."""
    ratio = summary.get("slowest_compute_ratio")
    if not ratio or ratio < threshold or summary.get("world_size", 1) < 2:
        return None
    return (f"straggler: rank {summary['slowest_rank']} on {summary['slowest_node']} computes {ratio:.1f}x the median "
            f"rank's time per step; the others waited {summary['waited_for_slowest_s']:.2f} s for it over "
            f"{summary['measured_steps']} steps")


def exposed_comm_ms(t: StepTiming) -> float:
    """What a step waited for communication beyond its compute: backward's wait for the last
    bucket (comm_wait_ms), and the collectives launched after backward (zero's broadcasts)."""
    after = [c for c in t.collectives if t.t_backward_end is not None and wall(c.launched) >= t.t_backward_end]
    return t.comm_wait_ms + in_flight_ms(after)


def step_model_fields(prediction, calibration: dict, step_ms: float | None, steps: list[StepTiming]) -> dict:
    """The SUMMARY's step-model fields: the prediction beside what rank 0 measured, its terms, what it
    was calibrated on, and its inputs exactly as predict() took them (labctl cost --from-run)."""
    calibration = dict(calibration)
    inputs, band = calibration.pop("inputs", None), calibration.pop("band_ms", None)
    trusted = calibration.pop("trusted", True)
    measured = statistics.fmean(exposed_comm_ms(t) for t in steps) if steps else None
    predicted_ms = round(prediction.step_ms, 3)  # the error is of the numbers the SUMMARY shows
    return {
        "predicted_step_ms": predicted_ms,
        "predicted_step_ms_band": band,
        "step_model_trusted": trusted,
        "predicted_exposed_comm_ms": round(prediction.exposed_comm_ms, 3),
        "exposed_comm_ms": round(measured, 3) if measured is not None else None,
        "step_model_error": round(step_ms / predicted_ms - 1, 4) if step_ms and predicted_ms else None,
        "step_model": {**prediction.record(), "calibration": calibration, "inputs": inputs},
    }


def too_short(band: list[float], predicted_ms: float) -> str:
    """Why a prediction is not trusted: the step is shorter than the noise its calibration measured."""
    return (f"too short to predict: its calibration spreads it from {band[0]:.1f} to {band[1]:.1f} ms (p10-p90), "
            f"wider than the {predicted_ms:.1f} ms step itself (mostly processes waking on shared cores)")


def prediction_line(prediction, calibration: dict) -> str:
    """The step model's prediction in words, printed before step 1; a step shorter than the noise its
    calibration measured gets why it is not predicted instead; a pipeline's names its stages, a tensor-parallel
    run its all-reduces."""
    if calibration.get("pipeline"):
        stages = ", ".join(f"{f:.1f}+{b:.1f}" for f, b in calibration["stage_ms"])
        sampled, played = calibration["sampled_ms"], calibration["played_out_ms"]
        return (f"step model: predicted {prediction.step_ms:.1f} ms a step = the schedule sampled {sampled:.1f} "
                f"({calibration['calibration_steps']} steps before the first, {calibration['accum']} micro-batches) + "
                f"optimizer {prediction.optimizer_ms:.1f}; played out from its stages' forward+backward ({stages} ms "
                f"a micro-batch) and transfers ({', '.join(f'{t:.2f}' for t in calibration['transfer_ms'])} ms) "
                f"{played:.1f}, the other {sampled - played:.1f} neither compute nor transfer")
    if calibration.get("tensor_parallel"):
        return (f"step model: predicted {prediction.step_ms:.1f} ms a step = the step sampled ({calibration['calibration_steps']} "
                f"steps before the first, {calibration['accum']} micro-batches, the optimizer on copies); of it, optimizer "
                f"{prediction.optimizer_ms:.1f}, the blocks' {calibration['tp_all_reduces']} "
                f"all-reduces inside the node {calibration['tp_all_reduce_ms']:.1f} (the cost model counts "
                f"{calibration['tp_all_reduces_priced']}), the gradients across nodes {calibration['across_nodes_ms']:.1f}, "
                f"compute {prediction.compute_ms:.1f}")
    if not calibration.get("trusted", True):
        return f"step model: {too_short(calibration['band_ms'], prediction.step_ms)}{links_note(calibration)}"
    link = calibration.get("link") or {}
    early = f", {prediction.sent_while_waiting_ms:.1f} of it sent while waiting" if prediction.sent_while_waiting_ms else ""
    hooks = prediction.terms.get("fsdp_hooks_ms", 0.0)
    comm = (f" + the link {prediction.exposed_comm_ms - prediction.waiting_ms - hooks:.1f} not hidden (of "
            f"{prediction.comm_ms - hooks:.1f} at {link['rate_bps'] / 1e6:.1f} Mbit/s, {link['stack_us'] / 1e3:.2f} ms a hop{early})"
            ) if link else ""
    comm += f" + FSDP2's own work {hooks:.1f}" if hooks else ""
    micro = f"{calibration['accum']} micro-step{'s' if calibration['accum'] > 1 else ''}"
    return (f"step model: predicted {prediction.step_ms:.1f} ms a step = compute {prediction.compute_ms:.1f} "
            f"({micro}) + waiting for the slowest rank {prediction.waiting_ms:.1f}{comm} + optimizer "
            f"{prediction.optimizer_ms:.1f}{links_note(calibration)}")


def links_note(calibration: dict) -> str:
    """Whose probes priced the link: the lab's, kept from an earlier run on the same state of its links,
    or this run's, kept for the runs after (trainer/linkstate.py); nothing where none is kept."""
    link = calibration.get("link") or {}
    if link.get("calibrated") == "kept":
        return f"; links as calibrated at {link['calibrated_at'][11:19]} by run {link['calibrated_by']} ({link['probes']} probes)"
    if link.get("calibrated") == "now":
        return (f"; links calibrated now, for this state of the lab's links ({link['probes']} probes in "
                f"{link['probing_s']:.2f} s, kept for the runs after)")
    return ""


def checked_line(summary: dict) -> str | None:
    """The prediction and its band against the measured step and its spread, after the last step:
    whether each lies within the other's."""
    if summary.get("step_model_error") is None:
        return None
    predicted, measured = summary["predicted_step_ms"], summary["step_ms"]
    band, spread = summary.get("predicted_step_ms_band"), (summary.get("step_ms_p10"), summary.get("step_ms_p90"))
    if not summary.get("step_model_trusted", True):
        return (f"step model: measured {measured:.1f} ms a step{_range(spread, ' (p10-p90 ', ')')}, not predicted: "
                f"{too_short(band, predicted)}")
    inside = [bool(edges) and None not in edges and edges[0] <= value <= edges[1]
              for value, edges in ((measured, band), (predicted, spread))]
    verdict = {(True, True): "each within the other's spread", (True, False): "the measured step within the band",
               (False, True): "the prediction within the measured spread",
               (False, False): "neither within the other's spread"}[tuple(inside)]
    return (f"step model: predicted {predicted:.1f} ms a step{_range(band, ' (', ')')}, measured {measured:.1f}"
            f"{_range(spread, ' (p10-p90 ', ')')} ({summary['step_model_error']:+.1%}), {verdict}; exposed comm "
            f"predicted {summary['predicted_exposed_comm_ms']:.1f}, measured {summary['exposed_comm_ms']:.1f}")


def _range(edges, before: str, after: str) -> str:
    return f"{before}{edges[0]:.1f}-{edges[1]:.1f}{after}" if edges and None not in edges else ""


class NoProfiler:
    """Stands in for torch.profiler when --profile is off: the loop calls step() either way."""

    def step(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def profiler_for(enabled: bool, device_type: str, path):
    """torch.profiler over steps 3-5 (after warm-up), written as a Chrome trace to `path`, or a no-op."""
    if not enabled:
        return NoProfiler()
    from pathlib import Path

    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device_type == "cuda" else [])
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return profile(activities=activities, schedule=schedule(wait=1, warmup=1, active=3, repeat=1),
                   on_trace_ready=lambda prof: prof.export_chrome_trace(str(path)))
