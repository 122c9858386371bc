"""Nothing left behind even after a crash: a lab whose owner process was killed with -9 is found and
removed by `labctl gc`, its overlay's helper and keys too; a lab from `labctl up` has no owner
process and is kept."""

import json
import os
import signal
import subprocess
import sys

import pytest

from conftest import REPO, drop_lab, lab_resources, labctl, new_lab_name

pytestmark = pytest.mark.integration

HOLDER = """
import sys, time
from labctl.api import Lab
with Lab(sys.argv[1], nodes=1, workspace=sys.argv[2], overlay="tailscale"):
    print("UP", flush=True)
    time.sleep(600)
"""


def verdicts() -> dict[str, dict]:
    result = labctl("gc", "--dry-run", "--json", check=True)
    return {v["lab"]: v for v in json.loads(result.stdout)}


def test_a_lab_whose_owner_was_killed_is_collected_and_a_cli_lab_is_kept(docker_client, node_image, lab_name):
    crashed = new_lab_name()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, crashed, str(REPO)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "UP"
        labctl("up", "--lab", lab_name, "--nodes", "1", check=True)
        seen = verdicts()
        assert not seen[crashed]["remove"] and "is alive" in seen[crashed]["why"]  # its owner still runs
        owner = next(lab["owner"] for lab in json.loads(labctl("ls", "--json", check=True).stdout)
                     if lab["lab"] == crashed)
        assert owner["pid"] == str(holder.pid) and owner["session"] == "api"

        os.kill(holder.pid, signal.SIGKILL)  # no __exit__, no down: the lab is left behind
        holder.wait(timeout=10)
        left = lab_resources(docker_client, crashed)["containers"]
        assert {f"{crashed}-node0", f"{crashed}-overlay-node0"} <= set(left), left
        keys = REPO / ".lab" / crashed / "overlay" / "keys.json"
        assert keys.is_file()
        seen = verdicts()
        assert seen[crashed]["remove"] and f"process {holder.pid} (api), has exited" in seen[crashed]["why"]
        assert not seen[lab_name]["remove"] and "no owner process (from cli)" in seen[lab_name]["why"]

        collected = labctl("gc", check=True)
        assert f"removed lab {crashed}: its owner, process {holder.pid}" in collected.stderr
        assert lab_resources(docker_client, crashed) == {"containers": [], "networks": [], "volumes": []}
        assert not keys.parent.exists(), "gc left the crashed lab's overlay keys"
        assert crashed not in verdicts() and lab_name in verdicts()  # gc found nothing more of it; the CLI lab stays
        assert lab_resources(docker_client, lab_name)["containers"] == [f"{lab_name}-node0"]
    finally:
        if holder.poll() is None:
            holder.kill()
        drop_lab(crashed)
