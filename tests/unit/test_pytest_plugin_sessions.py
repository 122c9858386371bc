"""The pytest plugin as pytest finds it: the entry point a pytest in an environment with ddplab
installed loads. Real pytest sessions with the plugin run in tests/host/test_pytest_plugin_sessions.py."""

from __future__ import annotations

from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]


def test_the_plugin_is_registered_as_ddplab():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["pytest11"] == {"ddplab": "labctl.pytest_plugin"}
