"""The local equivalents of the actions tests/ci/run_workflow.py knows (see its docstring).

Each takes the job's state and the step's `with:` inputs (expressions already substituted) and
returns (ok, outputs). An input the real action has but this stand-in does not honour is refused
(UnsupportedError), so a workflow never silently means something else here than on GitHub.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

FIND_PYTHON = Path(__file__).resolve().parents[2] / "labctl" / "scripts" / "find-python.sh"


HIDDEN_TOO = {"include_hidden": True} if sys.version_info >= (3, 11) else {}  # `**` into .folders (3.11+)


class UnsupportedError(Exception):
    """The workflow asks for something this script does not do: exit status 2."""


@dataclass
class Job:
    repo: Path
    sha: str
    workspace: Path
    temp: Path
    work: Path
    args: object  # run_workflow's argparse namespace: cache_dir, artifacts
    path_entries: list  # prepended to PATH for later steps (as GITHUB_PATH)
    post: list  # (name, if, callable) run after the last step, last registered first
    env: dict

    def local_path(self, text: str) -> Path:
        path = Path(os.path.expanduser(text.strip()))
        return path if path.is_absolute() else self.workspace / path


def _inputs(name: str, inputs: dict, known: set[str], required: tuple[str, ...] = ()) -> None:
    unknown = set(inputs) - known
    if unknown:
        raise UnsupportedError(f"{name}: input {', '.join(sorted(unknown))} is not supported here "
                               f"(supported: {', '.join(sorted(known))})")
    missing = [key for key in required if not inputs.get(key)]
    if missing:
        raise UnsupportedError(f"{name}: input {', '.join(missing)} is required")


def _lines(text: str) -> list[str]:
    return [line.strip() for line in str(text).splitlines() if line.strip()]


def _version(job: Job, paths: list[str]) -> list[str]:
    """The paths as part of a cache entry's version. A GitHub runner's temp folder and workspace are
    the same in every run; here each run has its own, so they are named rather than spelled out."""
    def named(path: str) -> str:
        return path.replace(str(job.temp), "$RUNNER_TEMP").replace(str(job.workspace), "$GITHUB_WORKSPACE")
    return [named(p) for p in paths]


def checkout(job: Job, inputs: dict, name: str) -> tuple[bool, dict]:
    """A clone of the repository at the commit being tested, into the (empty) workspace."""
    _inputs(name, inputs, {"fetch-depth", "persist-credentials"})
    subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(job.repo), str(job.workspace)], check=True)
    subprocess.run(["git", "-C", str(job.workspace), "checkout", "--quiet", "--detach", job.sha], check=True)
    print(f"cloned {job.repo} at {job.sha[:12]} into {job.workspace}")
    return True, {"commit": job.sha}


def setup_python(job: Job, inputs: dict, name: str) -> tuple[bool, dict]:
    """The interpreter python-version names, as a fresh virtual environment first on PATH."""
    _inputs(name, inputs, {"python-version"}, required=("python-version",))
    version = inputs["python-version"].strip()
    if version.count(".") != 1:
        raise UnsupportedError(f"{name}: python-version {version!r}: give major.minor, e.g. '3.11'")
    found = subprocess.run(["bash", str(FIND_PYTHON), f"python{version}"], capture_output=True, text=True)
    if found.returncode != 0:
        print(f"error: no Python {version} on this machine: {found.stderr.strip()}", file=sys.stderr)
        return False, {}
    interpreter = found.stdout.strip()
    venv = job.work / "tool-cache" / "Python" / version
    subprocess.run([interpreter, "-m", "venv", "--clear", str(venv)], check=True)
    actual = subprocess.run([str(venv / "bin" / "python"), "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
                            capture_output=True, text=True, check=True).stdout.strip()
    if not actual.startswith(version + "."):
        print(f"error: {interpreter} is Python {actual}, not {version}", file=sys.stderr)
        return False, {}
    job.path_entries.insert(0, str(venv / "bin"))
    print(f"Python {actual} from {interpreter}, as a fresh venv at {venv}")
    return True, {"python-version": actual, "python-path": str(venv / "bin" / "python")}


def _store(job: Job) -> Path:
    store = Path(job.args.cache_dir or job.work / "actions-cache")
    store.mkdir(parents=True, exist_ok=True)
    return store


def _entry(store: Path, key: str) -> Path:
    return store / key.replace("/", "%2F")


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)  # a 1 GB image tarball: a hard link where the folders share a file system
    except OSError:
        shutil.copy2(src, dst)


def _copy(src: Path, dst: Path) -> None:
    if dst.is_dir():
        shutil.rmtree(dst)
    elif dst.exists():
        dst.unlink()
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.copytree(src, dst, copy_function=_link_or_copy, symlinks=True)
    else:
        _link_or_copy(str(src), str(dst))


def cache_restore(job: Job, inputs: dict, name: str) -> tuple[bool, dict]:
    """Restore the entry saved under `key`, else the newest whose key starts with a restore-key. As on
    GitHub, an entry saved for other paths does not match (the paths are part of its version)."""
    _inputs(name, inputs, {"key", "path", "restore-keys", "fail-on-cache-miss", "lookup-only"},
            required=("key", "path"))
    store, key, paths = _store(job), inputs["key"].strip(), _lines(inputs["path"])
    outputs = {"cache-primary-key": key, "cache-hit": "false", "cache-matched-key": ""}

    def fits(entry: Path) -> bool:
        return entry.is_dir() and json.loads((entry / "paths.json").read_text()) == _version(job, paths)

    matched = _entry(store, key) if fits(_entry(store, key)) else None
    for prefix in _lines(inputs.get("restore-keys", "")) if matched is None else []:
        candidates = sorted((p for p in store.iterdir() if p.name.startswith(_entry(store, prefix).name) and fits(p)),
                            key=lambda p: p.stat().st_mtime, reverse=True)
        if candidates:
            matched = candidates[0]
            break
    if matched is None:
        print(f"Cache not found for input keys: {key}")
        return inputs.get("fail-on-cache-miss", "false").lower() != "true", outputs
    if inputs.get("lookup-only", "false").lower() != "true":
        for index, path in enumerate(paths):
            if (matched / str(index)).exists():
                _copy(matched / str(index), job.local_path(path))
    matched_key = matched.name.replace("%2F", "/")
    outputs.update({"cache-hit": str(matched_key == key).lower(), "cache-matched-key": matched_key})
    print(f"Cache restored from key: {matched_key}")
    return True, outputs


def cache_save(job: Job, inputs: dict, name: str) -> tuple[bool, dict]:
    """Save `path` under `key`, unless an entry with that key exists (GitHub refuses to overwrite)."""
    _inputs(name, inputs, {"key", "path"}, required=("key", "path"))
    store, key, paths = _store(job), inputs["key"].strip(), _lines(inputs["path"])
    entry = _entry(store, key)
    if entry.exists():
        print(f"Failed to save: a cache entry for key {key} exists already; not saving")
        return True, {}
    staging = store / f".saving-{os.getpid()}-{time.monotonic_ns()}"
    staging.mkdir()
    for index, path in enumerate(paths):
        if job.local_path(path).exists():
            _copy(job.local_path(path), staging / str(index))
    if not any(staging.iterdir()):
        shutil.rmtree(staging)
        print(f"Path Validation Error: none of {', '.join(paths)} exists; nothing saved")
        return True, {}
    (staging / "paths.json").write_text(json.dumps(_version(job, paths)))
    staging.rename(entry)
    print(f"Cache saved with key: {key}")
    return True, {}


def cache(job: Job, inputs: dict, name: str) -> tuple[bool, dict]:
    """actions/cache: restore now; save in a post step if the job succeeded and the key missed."""
    ok, outputs = cache_restore(job, {k: v for k, v in inputs.items() if k != "save-always"}, name)
    if outputs.get("cache-hit") != "true":
        save = {"key": inputs["key"], "path": inputs["path"]}
        job.post.append((name, "success()", lambda: cache_save(job, save, f"Post {name}")))
    return ok, outputs


def _shown(job: Job, path: Path) -> Path:
    """A file's name in the artifact: its path in the workspace (outside it, its own name)."""
    return path.relative_to(job.workspace) if path.is_relative_to(job.workspace) else Path(path.name)


def upload_artifact(job: Job, inputs: dict, name: str) -> tuple[bool, dict]:
    """Copies of the files matching `path` (globs; `!` lines exclude) under --artifacts/NAME/."""
    _inputs(name, inputs, {"name", "path", "if-no-files-found", "include-hidden-files", "retention-days",
                           "compression-level", "overwrite"}, required=("path",))
    hidden = inputs.get("include-hidden-files", "false").lower() == "true"
    files: set[Path] = set()
    excluded: set[Path] = set()
    for pattern in _lines(inputs["path"]):
        target = excluded if pattern.startswith("!") else files
        for match in glob.glob(str(job.local_path(pattern.lstrip("!"))), recursive=True, **HIDDEN_TOO):
            match = Path(match)
            target.update(p for p in ([match] if match.is_file() else match.rglob("*")) if p.is_file())
    chosen = sorted(f for f in files - excluded
                    if hidden or not any(part.startswith(".") for part in _shown(job, f).parts))
    if not chosen:
        how = inputs.get("if-no-files-found", "warn")
        print(f"{'Error' if how == 'error' else 'Warning'}: no files were found with the provided path: "
              f"{inputs['path'].strip()}. No artifacts will be uploaded.")
        return how != "error", {}
    folder = Path(job.args.artifacts or job.work / "artifacts") / (inputs.get("name") or "artifact")
    for path in chosen:
        (folder / _shown(job, path)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, folder / _shown(job, path))
    print(f"Artifact {folder.name}: {len(chosen)} files copied to {folder}")
    return True, {"artifact-id": folder.name}


ACTIONS = {
    "actions/checkout": checkout,
    "actions/setup-python": setup_python,
    "actions/cache": cache,
    "actions/cache/restore": cache_restore,
    "actions/cache/save": cache_save,
    "actions/upload-artifact": upload_artifact,
}
