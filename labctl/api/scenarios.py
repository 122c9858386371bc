"""The classic traps, reproduced on purpose on a throwaway lab, diagnosed, fixed: `labctl scenario
run` from Python. The runner is labctl.diagnose.scenarios, beside the traps (labctl.diagnose.traps);
what this layer gives it is the one bring-up (labctl.api.bringup), so that every scenario's lab comes
up as `labctl up` brings one up: its settings, packages, TCP congestion control, shaping and all."""

from __future__ import annotations

import os
from pathlib import Path

from labctl.api.bringup import bring_up, plan_up
from labctl.core.ui import Report
from labctl.diagnose import scenarios as runner
from labctl.diagnose.scenarios import SCENARIOS, ScenarioOutcome, scenario_lab, select_scenarios
from labctl.lab.owner import owner_of
from labctl.session import LabSession

__all__ = ["SCENARIOS", "ScenarioOutcome", "run_scenarios", "scenario_lab", "select_scenarios"]


def scenario_up(session: LabSession, images: dict[str, str] | None, report: Report) -> list:
    """A scenario's lab brought up (or back) through the same bring-up as `labctl up`; `images` puts
    nodes on another image (a node on another torch). Owned by this process: `labctl gc` removes a
    lab that a killed `labctl scenario` left."""
    owner = owner_of(os.environ, "scenario", os.getpid())
    plan = plan_up(session.client, session.config, session.workspace, owner=owner, images=images)
    nodes = bring_up(session, plan, report).nodes
    for node, image in (images or {}).items():
        report(f"{node} runs {image}")
    return nodes


def run_scenarios(client, make_spec, workspace: str | Path, names: list[str], report: Report, show=None,
                  overlay: str | None = None) -> list[ScenarioOutcome]:
    """`labctl scenario run [--overlay]`: each scenario in `names` on a 2-node lab of its own
    (`make_spec(lab=...)` resolves its spec), on the network it needs or `overlay`; `show` gets each
    outcome as soon as it is known (labctl.diagnose.scenarios.run_scenarios)."""
    return runner.run_scenarios(client, make_spec, Path(workspace), names, report, scenario_up, show, overlay)
