"""`labctl trace`: every rank of a run on one time axis, the ranks' clocks lined up by a moment they
share (records.py reads the run folder, align.py lines up the clocks, breakdown.py says where each
rank's time went, chrome.py merges the Chrome trace, picture.py and draw.py make the PNG, report.py
ties them together). What the CLI, `labctl run --trace` and `Lab.trace()` call:

    write_trace(run_dir: Path, *, steps: str | tuple[int | None, int | None] | None = None) -> TraceReport
    find_run(lab_directory: Path, run: str | None = None, cwd: Path | None = None) -> Path
"""

from labctl.trace.report import TraceReport, find_run, write_comparison, write_trace

__all__ = ["TraceReport", "find_run", "write_comparison", "write_trace"]
