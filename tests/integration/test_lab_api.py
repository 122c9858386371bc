"""labctl.api on a real engine: the README's example, as written there, and the failure paths a
test suite relies on (a failed run raises with its result; the lab goes whatever the body did)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from conftest import REPO, SCRIPTS, drop_lab, lab_resources

FAILING = str(SCRIPTS / "fail_on_rank.py")  # the rank given raises; the others wait
README_EXAMPLE = re.compile(r"<!-- api-example -->\n```python\n(.*?)```", re.S)


def readme_example() -> str:
    found = README_EXAMPLE.search((REPO / "README.md").read_text())
    assert found, "README.md has no <!-- api-example --> block"
    return found.group(1)


def test_the_readme_example_runs_and_leaves_nothing(docker_client, node_image, lab_name):
    code = readme_example()
    assert len(code.strip().splitlines()) <= 10 and '"api-demo"' in code
    # The one change: a lab name of this test's own, so parallel runs never share a lab.
    result = subprocess.run([sys.executable, "-c", code.replace('"api-demo"', f'"{lab_name}"')], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    rate_bps, final_loss = result.stdout.split()[-2:]
    assert int(rate_bps) == 100_000_000 and 0 < float(final_loss) < 5
    assert lab_resources(docker_client, lab_name) == {"containers": [], "networks": [], "volumes": []}


def test_a_failed_run_raises_with_its_result_and_the_lab_still_goes(docker_client, node_image, lab_name):
    from labctl.api import Lab
    from labctl.errors import RunFailed

    with pytest.raises(RunFailed) as caught:
        with Lab(lab_name, nodes=2, workspace=REPO) as lab:
            assert [n.name for n in lab.status()] == ["node0", "node1"]
            kept = lab.run(FAILING, "1", launcher="static", echo=False, check=False)
            assert not kept.ok and kept.exit_codes["node1"] != 0
            lab.run(FAILING, "1", launcher="static", echo=False)
    error = caught.value
    assert str(error).startswith("rank 1 on node1 failed first (") and "ValueError: deliberate failure on rank 1" in str(error)
    assert error.result.exit_codes["node1"] == 1
    assert error.result.logs["node1"].is_file()
    assert lab_resources(docker_client, lab_name) == {"containers": [], "networks": [], "volumes": []}
    drop_lab(lab_name)
