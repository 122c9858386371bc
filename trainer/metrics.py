"""Per-rank metrics as JSON lines: <run_dir>/metrics-rank<RANK>.jsonl.

One JSON object per line. Every record has: kind ("epoch" or "step"), rank,
epoch, step (optimizer steps so far on this rank), loss, samples (samples
seen so far by this rank), elapsed_s (since training began), time (unix
seconds). Each rank owns its file, so no locking is needed.
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
