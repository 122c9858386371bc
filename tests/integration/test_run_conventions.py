"""labctl run follows torchrun's and docker's conventions: torchrun's underscore spellings, -e and
--env-file on every rank, and a script path taken from the subdirectory the user stands in."""

from __future__ import annotations

import re

from conftest import REPO, SCRIPTS, labctl

SCRIPT = "tests/integration/scripts/env_report.py"
# From a subdirectory `python -m labctl` no longer finds this checkout's labctl as the current
# directory; say where it is (a venv shared between checkouts may have installed another).
HERE = {"PYTHONPATH": str(REPO)}


def reports(output: str) -> dict[str, str]:
    """rank -> the rest of its ENV_REPORT line."""
    return dict(re.findall(r"ENV_REPORT rank=(\S+) (.*)", output))


def test_env_reaches_every_rank_from_the_workspace_and_from_a_subdirectory(lab_name, tmp_path):
    labctl("up", "--lab", lab_name, "--nodes", "2", check=True)
    torchrun_style = ["run", "--lab", lab_name, "--nproc_per_node", "1", "--max_restarts", "0"]

    out = labctl(*torchrun_style, "-e", "EXPECT_VARS=RUN_KEY", "-e", "RUN_KEY=two words", "--", SCRIPT,
                 cwd=REPO, check=True).stdout
    assert reports(out) == {rank: f"script={SCRIPT} RUN_KEY='two words'" for rank in ("0", "1")}, out

    # From tests/integration/scripts/, the workspace (REPO, which holds .lab/) is found upwards and
    # the script is taken from where we stand; the env file's path too.
    (tmp_path / "run.env").write_text("# for every rank\nFILE_KEY=from-file\nexport RUN_KEY=overridden-by-e\n")
    out = labctl(*torchrun_style, "--env-file", str(tmp_path / "run.env"), "-e", "RUN_KEY=from-e",
                 "-e", "EXPECT_VARS=RUN_KEY,FILE_KEY", "--", "env_report.py", cwd=SCRIPTS, env=HERE, check=True).stdout
    assert reports(out) == {rank: f"script={SCRIPT} RUN_KEY='from-e' FILE_KEY='from-file'" for rank in ("0", "1")}, out

    # Without the variable the script fails on every rank, so the checks above are not vacuous.
    failed = labctl(*torchrun_style, "-e", "EXPECT_VARS=ABSENT_KEY", "--", "env_report.py", cwd=SCRIPTS, env=HERE)
    # (exit 3: the script's own status, passed on by labctl)
    assert failed.returncode == 3 and "ENV_REPORT rank=0 missing=ABSENT_KEY" in failed.stdout, failed.stdout
