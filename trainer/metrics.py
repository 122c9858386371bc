"""Per-rank metrics as JSON lines: <run_dir>/metrics-rank<RANK>.jsonl.

One JSON object per line, flushed as it is written; each rank owns its file, so no locking is
needed. Every record has `kind`, `rank` (the global rank) and `time` (unix seconds from
time.time() when the line was written). Times named `t` or `t_*` are unix seconds too, but from the
process's one clock (trainer/instrument.py: time.time() and time.perf_counter() sampled once at
start, then WALL0 + (perf_counter() - PERF0)), so they are as fine and as steady as the durations
and line up across a rank's records; rounded to the microsecond.

kind "step", one optimizer step. Global-batch mode writes one for every step; epoch mode one every
--log-every steps (none with 0).
  step            the step's number, from 1 (a resumed run goes on from the checkpoint's)
  samples         samples this rank has trained on so far in this run
  elapsed_s       seconds since the loop began on this rank
  epoch           epoch mode only: the epoch this step belongs to, from 1
  loss            epoch mode: this rank's mean loss per sample in the step's batch. Global-batch
                  mode: the mean loss per sample (gpt: per token) over the whole global batch, a
                  collective, so only on the steps that print it (every --log-every, and the last)
  rank_loss       global-batch mode only: this rank's mean loss per sample (gpt: per token) over
                  its share of the global batch
  compute_ms, comm_ms, comm_wait_ms, step_ms, wall_ms
                  milliseconds: where the step's time went (trainer/instrument.py says how each is
                  measured); comm_* are 0 without communication (world size 1)
  tokens          tokens (samples, for toy) in the step over all ranks
  tokens_per_s    tokens / wall_ms, in tokens per second (null if wall_ms is 0)
  t_start         the step began (before zero_grad)
  t_comm_start    the first gradient bucket was handed to the collective, null without communication
  t_comm_end      the last all-reduce finished, null without communication
  t_backward_end  backward() returned (after the device sync): the gradients are synchronised
  t_end           the optimizer step finished: the step's end

kind "epoch", epoch mode only, at every epoch's end.
  epoch           the epoch's number, from 1
  step            optimizer steps so far on this rank
  loss            this rank's mean loss per sample over the epoch (what the rank prints)
  samples         samples this rank has trained on so far
  elapsed_s       seconds since the loop began on this rank

kind "clock", twice per run, to line up the ranks' timelines: moments every rank shares.
  event           "start": just after barriers all ranks pass once set up, before the first step;
                  "end": just after the barrier in dist.compute_cleanup, after the last collective.
                  Without a process group (world size 1) there is no barrier to wait for.
  host            the machine's hostname (in a lab, the node's name): which node the rank ran on
  t_barriers      unix seconds, on the same clock as the steps' t_* fields, as this rank left each of
                  32 barriers passed back to back (train.log_clock says why several). Ranks leave a
                  barrier within about one message's latency of each other, so differences between
                  their times at one barrier are mostly differences between their clocks.
  t               the first of t_barriers

A script of your own gets `labctl trace`'s timeline by writing the same records: MetricsWriter (this
module; the trainer package is in the node image) to $DDPLAB_RUN_DIR/metrics-rank<RANK>.jsonl, a
"clock" record with `event`, `host` and `t` (or `t_barriers`) after a barrier before the first step
and another after one at the end, and per step `step`, `t_start`, `t_backward_end`, `t_end` and,
with communication, `t_comm_start`, `t_comm_end`, `comm_wait_ms`, `compute_ms` and `wall_ms`.
"""

import json
import time
from pathlib import Path


class MetricsWriter:
    def __init__(self, path):
        self.path = Path(path)
        self.file = open(self.path, "a", encoding="utf-8")

    def log(self, **record):
        record["time"] = time.time()
        self.file.write(json.dumps(record) + "\n")
        # Flush per record: a crashed or killed run still leaves its history.
        self.file.flush()

    def close(self):
        self.file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class NullMetrics:
    """Same interface, writes nothing: callers never need `if metrics:`."""

    def log(self, **record):
        pass

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def open_metrics(run_dir, rank, enabled=True):
    """MetricsWriter for this rank under run_dir, or NullMetrics if disabled."""
    if not enabled:
        return NullMetrics()
    run_dir = Path(run_dir)
    try:
        # exist_ok: every rank on the node races to create the same directory.
        run_dir.mkdir(parents=True, exist_ok=True)
        return MetricsWriter(run_dir / f"metrics-rank{rank}.jsonl")
    except OSError as e:
        raise SystemExit(
            f"error: cannot write metrics under run dir '{run_dir}': "
            f"{e.strerror or e}. Pass --run-dir or set DDPLAB_RUN_DIR to a "
            "writable path, or use --no-metrics"
        ) from None


def write_clock(metrics, rank, event, barriers, left_at=None):
    """A "clock" record: this rank's times, on the process's one clock (trainer/instrument.py), as it
    leaves `barriers` barriers back to back (`left_at`: it has just left one, which counts as the
    first). Every rank must call it: the barriers are collectives."""
    import socket

    from trainer.dist import barrier_times
    from trainer.instrument import wall_now

    first = [left_at] if left_at is not None else []
    times = first + barrier_times(barriers - len(first), wall_now)
    metrics.log(kind="clock", event=event, rank=rank, host=socket.gethostname(), t=round(times[0], 6),
                t_barriers=[round(t, 6) for t in times])
