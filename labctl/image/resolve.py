"""Resolve a lab's packages once, on the host, for the node, and fetch the wheels: the side effects
behind labctl.image.packages and labctl.image.lockfile.

The resolver is the host's pip, told the node's interpreter and platform (`--python-version
--implementation --abi --platform --only-binary=:all:`, as the node image's wheelhouse already is:
labctl/image/wheelhouse.py) and asked for an installation report (`pip install --dry-run --report`):
every package's version, wheel and sha256 from the index's metadata, nothing installed. pip rather
than uv because it is the one resolver that sees what the node image's torch came from: pip's own
configuration (pip.conf, PIP_INDEX_URL, PIP_FIND_LINKS with a local CPU build of torch, constraint
files) and its local version labels (2.13.0+cpu). uv reads none of that, and resolving torch 2.13.0
from PyPI gives its CUDA build's nvidia-* dependencies, GBs a CPU node must not get.

pip still reads dependency markers for the interpreter that runs it (pypa/pip#6117), so the report is
walked again with the node's markers (wheelhouse.wheel_closure), and what pip skipped is asked for.

Caching, so that the same requirements give the same packages tomorrow, offline:
  <cache>/packages/locks/<inputs digest>.toml   the lock each declaration was resolved to
  <cache>/packages/wheels/                      every wheel a package image was made from
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Iterable
from urllib.parse import unquote, urlsplit

from labctl.core.proc import run
from labctl.core.ui import Report
from labctl.errors import CommandError, LabError, StateError
from labctl.image.image import wheel_requirements
from labctl.image.lockfile import (
    Lock,
    Pin,
    hash_requirements,
    lock_from_report,
    parse_lock,
    release,
    render_lock,
    same_version,
)
from labctl.image.packages import (
    TORCH,
    Declaration,
    check_torch,
    checked_requirements,
    inputs_digest,
    pyproject_requirements,
    torch_refusal,
)
from labctl.image.piperrors import explain_pip_failure
from labctl.image.wheelhouse import (
    MAX_ROUNDS,
    Target,
    pip_report_argv,
    pip_target_options,
    report_wheels,
    wheel_closure,
)

PIP_TIMEOUT_S = 900


def packages_dir(cache: Path) -> Path:
    return cache / "packages"


def wheels_dir(cache: Path) -> Path:
    return packages_dir(cache) / "wheels"


def ensure_lock(declaration: Declaration, *, torch: str, target: Target, cache: Path, report: Report,
                find_links: Iterable[Path] = (), torch_index_url: str | None = None) -> Lock:
    """The lock for `declaration`: a pylock.toml given is the lock itself; otherwise the one resolved
    before from the same inputs, else pip's resolution now (cached for next time). Refuses a
    requirement of another torch than `torch`, before pip runs where it can tell."""
    if declaration.kind == "pylock" and not declaration.extra:
        return given_lock(declaration, torch, target)
    inputs = inputs_digest(declaration, torch, target)
    cached = packages_dir(cache) / "locks" / f"{inputs}.toml"
    if cached.is_file():
        return parse_lock(cached.read_text(), str(cached), target)
    if declaration.kind == "pylock":
        raise LabError(f"{declaration.file} is a lock: it does not go with --with {' '.join(declaration.extra)}",
                       hint="add the packages to the lock, or give a requirements file or pyproject.toml instead")
    roots = list(declaration.extra)
    if declaration.kind == "pyproject":
        roots = checked_requirements(pyproject_requirements(declaration), str(declaration.file)) + roots
    check_torch(roots, torch, declaration.shown)
    args = ["-r", str(declaration.file), *roots] if declaration.kind == "requirements" else roots
    report(f"packages: resolving {declaration.shown} with torch {torch} for the nodes ({target.describe()})")
    pins = resolve(args, torch=torch, target=target, find_links=[wheels_dir(cache), *find_links],
                   torch_index_url=torch_index_url)
    lock = Lock(tuple(pins), inputs, declaration.declared, torch, target.describe())
    write_atomic(cached, render_lock(lock, target))
    return parse_lock(cached.read_text(), str(cached), target)


def given_lock(declaration: Declaration, torch: str, target: Target) -> Lock:
    """A pylock.toml the user gives: what it selects for the node, refused where its torch is another release."""
    lock = parse_lock(declaration.file.read_text(), str(declaration.file), target)
    pinned = lock.pin(TORCH)
    if pinned and not same_version(release(pinned.version), torch):
        raise torch_refusal(f"{declaration.file} locks torch {pinned.version}", torch, f"torch=={pinned.version}")
    return lock


def resolve(args: list[str], *, torch: str, target: Target, find_links: Iterable[Path] = (),
            torch_index_url: str | None = None) -> list[Pin]:
    """pip's resolution of `args` (requirements, or -r FILE) together with the lab's torch and numpy,
    for the node; every package the node's Python would see, as pins with hashes. torch's CPU build
    comes from `find_links` (the node image's wheelhouse) or pip's own find-links, as the node image's
    did; where they have none, pip gets PyPI's torch for Linux, which is the CUDA build, and then the
    resolution is made again with `torch_index_url` (the CPU index) beside pip's index."""
    links = [arg for path in find_links if Path(path).is_dir() for arg in ("--find-links", str(path))]
    pins = resolve_with(args, links, torch, target)
    if torch_index_url and cuda_pins(pins):
        pins = resolve_with(args, [*links, "--extra-index-url", torch_index_url], torch, target)
    cuda = cuda_pins(pins)
    if cuda:
        raise LabError(f"the resolution took torch {torch}'s CUDA build, with {', '.join(cuda[:3])}, ...: GBs the "
                       "nodes' CPU build of torch does not need",
                       hint="let pip find the CPU build: PIP_FIND_LINKS with the wheel, or DDPLAB_TORCH_INDEX_URL "
                            "(https://download.pytorch.org/whl/cpu)")
    return pins


def resolve_with(args: list[str], links: list[str], torch: str, target: Target) -> list[Pin]:
    asked = [*wheel_requirements(torch), *args]
    with tempfile.TemporaryDirectory(prefix="ddplab-resolve-") as tmp:
        answer = Path(tmp) / "report.json"
        for _ in range(MAX_ROUNDS):
            items = pip_report(asked, links, target, answer, torch)
            roots = [*wheel_requirements(torch), *requested(items)]
            needed, missing = wheel_closure(report_wheels({"install": items}), roots, target)
            if not missing:
                return lock_from_report(items, needed)
            asked += missing  # what pip skipped, reading markers for this host's Python
    raise LabError(f"the resolution for {target.describe()} still lacks {', '.join(missing)}",
                   hint=f"check that your package index has wheels of them for {target.abi} on {target.machine}")


def cuda_pins(pins: list[Pin]) -> list[str]:
    """The CUDA runtime's packages among pins: what only torch's CUDA build brings."""
    return [p.line for p in pins if p.name.startswith("nvidia-")]


def requested(items: list[dict]) -> list[str]:
    """The report's requested packages, pinned as resolved (a requirements file's lines, read by pip)."""
    out = []
    for item in items:
        if item.get("requested"):
            extras = item.get("requested_extras") or []
            out.append(f"{item['metadata']['name']}{'[' + ','.join(extras) + ']' if extras else ''}"
                       f"=={item['metadata']['version']}")
    return out


def pip_report(asked: list[str], links: list[str], target: Target, answer: Path, torch: str) -> list[dict]:
    argv = pip_report_argv(sys.executable, target, answer, [*links, *asked])
    argv = [a for a in argv if a != "--quiet"]  # pip's reasons (the conflict) are printed at its normal level
    try:
        run(argv, timeout_s=PIP_TIMEOUT_S)
    except CommandError as exc:
        explained = explain_pip_failure(f"{exc.stdout}\n{exc.stderr}", target, torch)
        if explained:
            raise explained from None
        raise LabError(f"pip could not resolve the packages for the nodes: {exc}") from None
    return json.loads(answer.read_text()).get("install", [])


# ------------------------------------------------------------------------------------ wheels


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_wheels(pins: list[Pin], cache: Path, target: Target, report: Report) -> list[Path]:
    """The wheel file of every pin, verified against its sha256: from the cache, from a local file the
    lock names, else downloaded by the host's pip in hash-checking mode. Offline, only what is cached."""
    folder = wheels_dir(cache)
    folder.mkdir(parents=True, exist_ok=True)
    missing = [p for p in pins if not verified(folder / p.wheel, p)]
    for pin in [p for p in missing if p.url.startswith("file:")]:
        local = Path(unquote(urlsplit(pin.url).path))
        if local.is_file():
            shutil.copyfile(local, folder / pin.wheel)
    missing = [p for p in missing if not verified(folder / p.wheel, p)]
    if missing:
        report(f"packages: downloading {len(missing)} wheels for the nodes ({', '.join(p.line for p in missing[:6])}"
               f"{', ...' if len(missing) > 6 else ''})")
        download(missing, folder, target)
    bad = [p for p in pins if not verified(folder / p.wheel, p)]
    if bad:
        raise LabError(f"the wheels of {', '.join(p.line for p in bad)} do not match the lock's sha256",
                       hint="the index serves other bytes under the same name; resolve again (remove the lock)")
    return [folder / p.wheel for p in pins]


def verified(path: Path, pin: Pin) -> bool:
    return path.is_file() and (not pin.sha256 or sha256_of(path) == pin.sha256)


def download(pins: list[Pin], folder: Path, target: Target) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".txt", prefix="ddplab-lock-") as requirements:
        requirements.write(hash_requirements(pins))
        requirements.flush()
        argv = [sys.executable, "-m", "pip", "download", "--no-deps", *pip_target_options(target), "-d", str(folder),
                "--require-hashes", "-r", requirements.name]
        try:
            run(argv, timeout_s=PIP_TIMEOUT_S)
        except CommandError as exc:
            cached = sorted(p.name for p in folder.glob("*.whl"))
            explained = explain_pip_failure(f"{exc.stdout}\n{exc.stderr}", target, "", cached)
            if isinstance(explained, StateError):
                raise StateError(f"no package index answers, and no cached wheel has "
                                 f"{', '.join(p.line for p in pins)} for the nodes", hint=explained.hint) from None
            raise LabError(f"pip could not download the lock's wheels: {exc}") from None


def fetch_requirement(requirement: str, cache: Path, target: Target) -> Path:
    """The wheel of one pinned requirement (NAME==VERSION) for the node, from the cache or the index
    (pip download, for the node's Python): its path in the cache."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name, parse_wheel_filename

    wanted = Requirement(requirement)
    folder = wheels_dir(cache)

    def cached() -> Path | None:
        return next((p for p in sorted(folder.glob("*.whl"))
                     if canonicalize_name(parse_wheel_filename(p.name)[0]) == canonicalize_name(wanted.name)
                     and wanted.specifier.contains(parse_wheel_filename(p.name)[1], prereleases=True)), None)

    if cached() is None:
        folder.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "pip", "download", "--no-deps", *pip_target_options(target), "-d", str(folder),
                requirement]
        try:
            run(argv, timeout_s=PIP_TIMEOUT_S)
        except CommandError as exc:
            raise explain_pip_failure(f"{exc.stdout}\n{exc.stderr}", target, "") or LabError(str(exc)) from None
    return cached()


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` so that a concurrent reader sees the old file or the new, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as stream:
        stream.write(text)
    os.replace(tmp, path)
