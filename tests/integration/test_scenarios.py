"""Every trap reproduced for real, diagnosed by doctor in seconds, fixed, within its bound, and
nothing left behind but, for a scenario diagnosed with the timeline (the straggler), the broken
run's folder with its picture. Those met on a mesh VPN are test_scenarios_mesh.py's (another
worker's, beside these)."""

from __future__ import annotations

import pytest
from conftest import labctl, run_scenario

from labctl.api.scenarios import SCENARIOS

ON_BRIDGE = [name for name, s in SCENARIOS.items() if s.overlays[0] == "none"]


# The straggler scenario's verdict rests on a CPU share that a second test's load would blur.
@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.alone) if name == "straggler" else name
                                  for name in ON_BRIDGE])
def test_scenario_shows_diagnoses_and_fixes(name, docker_client, node_image):
    run_scenario(name, docker_client)


def test_unknown_scenario_is_refused():
    result = labctl("scenario", "run", "nope")
    assert result.returncode == 2 and "no scenario 'nope'" in result.stderr
