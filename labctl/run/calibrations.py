"""The link calibrations a lab's runs keep, read back for `labctl status`.

The trainer probes the link once for each state of the lab's links and keeps the samples in
<lab folder>/links/<state>.json (trainer/linkstate.py, which writes them; labctl only reads).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from labctl.run.launch import LINKS_FOLDER


def latest_calibration(lab_directory: Path) -> dict | None:
    """The newest kept calibration: when ("at"), by which run ("run"), over which ranks' hosts and
    backend, how many latency probes and their median ("probe_us"), and how many states the lab has
    kept ("states"); None where no run has kept one."""
    found = []
    for path in (lab_directory / LINKS_FOLDER).glob("*.json"):
        try:
            found.append((path.stat().st_mtime, json.loads(path.read_text())))
        except (OSError, ValueError):
            continue  # half written by a run now, or not a calibration
    kept = [record for _, record in sorted(found, key=lambda f: f[0]) if isinstance(record, dict) and record.get("small_s")]
    if not kept:
        return None
    last = kept[-1]
    return {"at": last.get("at"), "run": last.get("run"), "hosts": last.get("hosts"), "backend": last.get("backend"),
            "probes": len(last["small_s"]), "probe_us": round(statistics.median(last["small_s"]) * 1e6, 1),
            "states": len(kept)}
