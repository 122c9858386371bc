"""Every trap reproduced for real, diagnosed by doctor in seconds, fixed, within its bound, and
nothing left behind but, for a scenario diagnosed with the timeline (the straggler), the broken
run's folder with its picture. Those met on a mesh VPN are test_scenarios_mesh.py's (another
worker's, beside these)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import PNG_MAGIC, REPO, lab_resources, labctl

from labctl.api.scenarios import SCENARIOS


ON_BRIDGE = [name for name, s in SCENARIOS.items() if s.overlays[0] == "none"]


# The straggler scenario's verdict rests on a CPU share that a second test's load would blur.
@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.alone) if name == "straggler" else name
                                  for name in ON_BRIDGE])
def test_scenario_shows_diagnoses_and_fixes(name, docker_client, node_image):
    run_scenario(name, docker_client)


def run_scenario(name: str, docker_client, *options: str) -> dict:
    """`labctl scenario run NAME OPTIONS...`, checked, and nothing of its lab left: its outcome."""
    kept = REPO / ".lab" / f"scn-{name}"
    try:
        result = labctl("scenario", "run", name, *options, "--json", timeout=SCENARIOS[name].bound_s + 60)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        [outcome] = json.loads(result.stdout)
        check_outcome(name, outcome, kept)
    finally:
        shutil.rmtree(kept, ignore_errors=True)
    assert lab_resources(docker_client, f"scn-{name}") == {"containers": [], "networks": [], "volumes": []}
    return outcome


def check_outcome(name: str, outcome: dict, kept: Path) -> None:
    assert outcome["ok"] and outcome["fixed_ok"]
    # version-mismatch's honest symptom may be none at all: torch never checks
    assert outcome["symptom"] or not SCENARIOS[name].symptom_required, "the broken run showed no symptom"
    assert outcome["doctor"], "doctor found nothing wrong with the broken configuration"
    assert outcome["doctor_seconds"] < 5
    assert outcome["total_seconds"] <= SCENARIOS[name].bound_s
    if SCENARIOS[name].timeline:  # the straggler: node1 at a fraction of a CPU in the broken run
        assert outcome["timeline"].startswith("the others waited for rank 1 (node1): "), outcome["timeline"]
        png = Path(outcome["timeline"].rsplit("timeline: ", 1)[1])
        assert png.read_bytes()[:8] == PNG_MAGIC and png.is_relative_to(kept / "runs")
    else:
        assert not kept.exists()


def test_unknown_scenario_is_refused():
    result = labctl("scenario", "run", "nope")
    assert result.returncode == 2 and "no scenario 'nope'" in result.stderr


def test_a_scenario_on_a_network_it_cannot_be_met_on_is_refused_before_any_starts(docker_client):
    result = labctl("scenario", "run", "wrong-nic", "straggler", "--overlay", "tailscale")
    assert result.returncode == 2, result.stderr
    assert "invalid --overlay='tailscale': not a network these scenarios can be met on: straggler on none" \
        in result.stderr, result.stderr
    assert lab_resources(docker_client, "scn-wrong-nic") == {"containers": [], "networks": [], "volumes": []}
