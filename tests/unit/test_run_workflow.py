"""tests/ci/run_workflow.py, the local stand-in for a GitHub runner: its expressions, its actions,
and whole jobs of `run:` steps in a real git repository (no Docker). The example workflow itself
runs through it in tests/integration/test_ci_workflow.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "ci"))

import gha_actions  # noqa: E402
import run_workflow  # noqa: E402
from gha_expr import ExpressionError, condition, evaluate, substitute  # noqa: E402

WORKFLOW = REPO / "examples" / "ci" / "ddplab.yml"
CONTEXTS = {
    "github": {"workspace": "/w", "run_id": "7"},
    "runner": {"temp": "/t", "os": "Linux"},
    "env": {"NAME": "x"},
    "steps": {"image-cache": {"outputs": {"cache-hit": "true"}}, "image": {"outputs": {"hash": "abc"}}},
}


@pytest.mark.parametrize("text, expected", [
    ("steps.image-cache.outputs.cache-hit == 'true'", True),
    ("steps.image-cache.outputs.cache-hit != 'true'", False),
    ("steps.image-cache.outputs.cache-hit == 'TRUE'", True),  # strings compare case-insensitively
    ("steps.missing.outputs.x", None),  # a missing property is null
    ("steps.missing.outputs.x == ''", True),
    ("env.NAME", "x"),
    ("!(env.NAME == 'x') || false", False),
    ("env.NAME && 'then'", "then"),
    ("'it''s'", "it's"),
    ("null", None),
    ("1 == 1", True),
])
def test_expressions(text, expected):
    assert evaluate(text, CONTEXTS) == expected


@pytest.mark.parametrize("text", ["secrets.TOKEN", "hashFiles('x')", "env.NAME ==", "(true", "env.NAME ~ 1"])
def test_what_it_cannot_evaluate_is_refused(text):
    with pytest.raises(ExpressionError):
        evaluate(text, CONTEXTS)


def test_substitute():
    assert substitute("${{ runner.temp }}/ddplab-image-${{ steps.image.outputs.hash }}", CONTEXTS) == "/t/ddplab-image-abc"
    assert substitute("gha-${{ github.run_id }}-${{ steps.image-cache.outputs.cache-hit == 'true' }}", CONTEXTS) == \
        "gha-7-true"


@pytest.mark.parametrize("text, failed, expected", [
    (None, False, True), (None, True, False),
    ("always()", True, True), ("failure()", True, True), ("failure()", False, False),
    ("steps.image-cache.outputs.cache-hit == 'true'", False, True),
    ("steps.image-cache.outputs.cache-hit == 'true'", True, False),  # success() is implied
    ("${{ steps.image-cache.outputs.cache-hit != 'true' }}", False, False),
    ("always() && env.NAME == 'y'", True, False),
    (True, False, True),
])
def test_if_conditions(text, failed, expected):
    assert condition(text, CONTEXTS, failed) is expected


def test_env_files():
    text = "hash=abc\nempty=\nbody<<EOF\nline 1\nline=2\nEOF\n\nurl=a=b\n"
    assert run_workflow.parse_env_file(text) == {"hash": "abc", "empty": "", "body": "line 1\nline=2", "url": "a=b"}
    with pytest.raises(gha_actions.UnsupportedError):
        run_workflow.parse_env_file("body<<EOF\nnever closed\n")


def test_the_example_workflow_asks_only_for_what_the_runner_does():
    """Every action it uses has a local equivalent, every expression reads a context the runner
    fills, and the tests it runs are one env: value away from the user's own."""
    workflow = yaml.safe_load(WORKFLOW.read_text())
    (job,) = workflow["jobs"].values()
    for step in job["steps"]:
        if "uses" in step:
            name, _, version = step["uses"].partition("@")
            assert name in gha_actions.ACTIONS, step["uses"]
            assert re.fullmatch(r"v\d+", version), f"{step['uses']}: pin the major version"
    text = WORKFLOW.read_text()
    heads = {m.split(".")[0] for expr in re.findall(r"\$\{\{(.*?)\}\}", text) for m in re.findall(r"[a-z][\w.-]*", expr)
             if not m.startswith("'")}
    assert heads <= {"github", "runner", "steps", "env"}, heads
    assert "DDPLAB_TESTS" in job["env"] and "$DDPLAB_TESTS" in text
    cleanup = job["steps"][-1]
    assert cleanup["if"] == "always()" and "labctl down" in cleanup["run"]
    assert "labctl gc" not in cleanup["run"], "gc judges owners by pid: on a shared engine it takes others' labs"
    assert [s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact")][0]["if"] == "failure()"


# ------------------------------------------------------------------------------------ actions


def job_for(tmp_path: Path) -> gha_actions.Job:
    workspace = tmp_path / "ws"
    workspace.mkdir(parents=True)
    return gha_actions.Job(tmp_path, "0" * 40, workspace, tmp_path / "temp", tmp_path,
                           Namespace(cache_dir=str(tmp_path / "store"), artifacts=str(tmp_path / "artifacts")),
                           [], [], {})


def test_cache_save_then_restore(tmp_path):
    job = job_for(tmp_path)
    (job.workspace / "img").mkdir()
    (job.workspace / "img" / "images.tar").write_text("layers")
    assert gha_actions.cache_save(job, {"key": "k-1", "path": "img"}, "save") == (True, {})
    assert gha_actions.cache_save(job, {"key": "k-1", "path": "img"}, "save") == (True, {}), "an existing key is kept"
    (job.workspace / "img" / "images.tar").unlink()
    ok, out = gha_actions.cache_restore(job, {"key": "k-1", "path": "img"}, "restore")
    assert ok and out["cache-hit"] == "true" and (job.workspace / "img" / "images.tar").read_text() == "layers"
    ok, out = gha_actions.cache_restore(job, {"key": "k-2", "path": "img", "restore-keys": "k-"}, "restore")
    assert ok and out == {"cache-primary-key": "k-2", "cache-hit": "false", "cache-matched-key": "k-1"}
    ok, out = gha_actions.cache_restore(job, {"key": "k-1", "path": "other"}, "restore")
    assert ok and out["cache-hit"] == "false", "an entry saved for other paths is another version"


def test_a_cache_entry_outlives_the_run_that_saved_it(tmp_path):
    """A runner's temp folder has the same path in every run, and a key saved under it is found by
    the next run; here every run has its own temp folder, which must not make every run miss."""
    first, second = job_for(tmp_path / "run1"), job_for(tmp_path / "run2")
    second.args = first.args
    for job in (first, second):
        job.temp.mkdir()
    (first.temp / "img").mkdir()
    (first.temp / "img" / "images.tar").write_text("layers")
    gha_actions.cache_save(first, {"key": "k", "path": f"{first.temp}/img"}, "save")
    ok, out = gha_actions.cache_restore(second, {"key": "k", "path": f"{second.temp}/img"}, "restore")
    assert ok and out["cache-hit"] == "true" and (second.temp / "img" / "images.tar").read_text() == "layers"
    with pytest.raises(gha_actions.UnsupportedError):
        gha_actions.cache_restore(job, {"key": "k-1", "path": "img", "enableCrossOsArchive": "true"}, "restore")


def test_upload_artifact_leaves_hidden_files_out_unless_asked(tmp_path):
    job = job_for(tmp_path)
    log = job.workspace / ".lab" / "demo" / "runs" / "r1" / "node0.log"
    log.parent.mkdir(parents=True)
    log.write_text("rank 0\n")
    ok, _ = gha_actions.upload_artifact(job, {"name": "logs", "path": ".lab/*/runs/**"}, "upload")
    assert ok and not (tmp_path / "artifacts" / "logs").exists()
    ok, _ = gha_actions.upload_artifact(job, {"name": "logs", "path": ".lab/*/runs/**", "include-hidden-files": "true"},
                                        "upload")
    assert ok and (tmp_path / "artifacts" / "logs" / ".lab" / "demo" / "runs" / "r1" / "node0.log").read_text() == "rank 0\n"
    ok, _ = gha_actions.upload_artifact(job, {"name": "none", "path": "nothing/**", "if-no-files-found": "error"},
                                        "upload")
    assert not ok


# --------------------------------------------------------------------------------- whole jobs


def git_repo(tmp_path: Path, workflow: dict) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir(parents=True)
    (repo / "wf.yml").write_text(yaml.safe_dump(workflow, sort_keys=False))
    for argv in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "wf"]):
        subprocess.run(["git", "-C", str(repo), *argv], check=True)
    return repo


def run_job(tmp_path: Path, steps: list, env: dict | None = None, extra: tuple = ()) -> tuple[int, dict, str]:
    repo = git_repo(tmp_path, {"on": "push", "jobs": {"j": {"runs-on": "ubuntu-latest", "env": env or {},
                                                            "steps": steps}}})
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "ci" / "run_workflow.py"), str(repo / "wf.yml"),
                           "--repo", str(repo), "--work", str(tmp_path / "work"), *extra],
                          capture_output=True, text=True, timeout=60)
    result = tmp_path / "work" / "result.json"
    return proc.returncode, json.loads(result.read_text()) if result.exists() else {}, proc.stdout + proc.stderr


def outcomes(result: dict) -> list[str]:
    return [s["outcome"] for s in result["steps"]]


def test_a_job_passes_outputs_env_and_path_between_steps(tmp_path):
    steps = [
        {"uses": "actions/checkout@v6"},
        {"id": "a", "run": 'echo "value=$GREETING-${{ github.workspace }}" >> "$GITHUB_OUTPUT"\n'
                           'echo "LATER=set" >> "$GITHUB_ENV"\nmkdir -p bin && printf "#!/bin/sh\\necho tool\\n" > bin/t'
                           ' && chmod +x bin/t && echo "$PWD/bin" >> "$GITHUB_PATH"'},
        {"env": {"GOT": "${{ steps.a.outputs.value }}"},
         "run": 'test -f wf.yml && test "$LATER" = set && test "$(t)" = tool && echo "got=$GOT" && test "$CI" = true'},
    ]
    code, result, output = run_job(tmp_path, steps, env={"GREETING": "hi"})
    assert code == 0, output
    assert outcomes(result) == ["success"] * 3
    assert result["outputs"]["a"]["value"] == f"hi-{result['workspace']}"
    assert f"got=hi-{result['workspace']}" in output


def test_a_failed_step_skips_the_rest_but_not_failure_or_always(tmp_path):
    steps = [
        {"name": "fails", "run": "exit 3"},
        {"name": "skipped", "run": "echo ran-$((1 + 1))"},
        {"name": "on failure", "if": "failure()", "run": "echo ran-$((2 + 1))"},
        {"name": "always", "if": "always()", "run": "echo ran-$((3 + 1))"},
        {"name": "on success", "if": "success()", "run": "echo ran-$((4 + 1))"},
    ]
    code, result, output = run_job(tmp_path, steps)
    assert code == 1
    assert outcomes(result) == ["failure", "skipped", "success", "success", "skipped"]
    assert re.findall(r"ran-\d", output) == ["ran-3", "ran-4"]


def test_env_overrides_and_unsupported_actions(tmp_path):
    code, result, output = run_job(tmp_path, [{"run": 'test "$X" = "${{ github.workspace }}"'}], env={"X": "job"},
                                   extra=("--env", "X=${{ github.workspace }}"))
    assert code == 0, output
    code, _, output = run_job(tmp_path / "b", [{"uses": "docker/build-push-action@v6"}])
    assert code == 2 and "has no local equivalent" in output
