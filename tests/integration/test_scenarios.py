"""Every trap reproduced for real, diagnosed by doctor in seconds, fixed, within its bound, and
nothing left behind but, for a scenario diagnosed with the timeline (the straggler), the broken
run's folder with its picture. Those met on a mesh VPN are test_scenarios_mesh.py's (another
worker's, beside these)."""

from __future__ import annotations

import pytest
from conftest import labctl, lab_resources, run_scenario

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


def test_a_scenario_on_a_network_it_cannot_be_met_on_is_refused_before_any_starts(docker_client):
    result = labctl("scenario", "run", "wrong-nic", "straggler", "--overlay", "tailscale")
    assert result.returncode == 2, result.stderr
    assert "invalid --overlay='tailscale': not a network these scenarios can be met on: straggler on none" \
        in result.stderr, result.stderr
    assert lab_resources(docker_client, "scn-wrong-nic") == {"containers": [], "networks": [], "volumes": []}
