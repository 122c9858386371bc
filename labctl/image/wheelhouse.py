"""The node image's Python packages, fetched on the host for the node's interpreter and platform.

Packages never come from inside a container (pip there may have no network, or a proxy whose CA
it does not trust), so the host's pip downloads wheels into `.lab/wheelhouse` and the Dockerfile
installs them with `--no-index`. The host may run any Python on any OS (3.12 on Ubuntu 24.04,
3.13 on Fedora, macOS on arm64), while every node runs the base image's CPython (3.11 on Debian
bookworm, glibc 2.36) on the engine's architecture. So pip is told the target outright
(`--python-version --implementation --abi --platform`, with `--only-binary=:all:`), and what
lands in the wheelhouse is the same whatever Python ran labctl.

One gap remains in pip: with a target given, it still evaluates dependency markers
(`python_version < "3.12"`, `platform_system == "Linux"`) against the interpreter that runs it
(pypa/pip#6117, #11010). `wheel_closure` therefore walks the downloaded wheels' own metadata with
the target's markers: whatever the node needs and pip skipped is fetched, whatever only the host
would need is removed, and the wheelhouse (and so the image's build hash) is identical from every
host.

The hash needs only the wheels' names. `resolve_wheelhouse` gets them from pip's installation
report (`install --dry-run --report`), walked the same way, with nothing downloaded: the CUDA
image's GBs are fetched only for a build.
"""

from __future__ import annotations

import json
import shutil
import sys
import zipfile
from dataclasses import asdict, dataclass
from email.parser import HeaderParser
from pathlib import Path
from typing import Callable, Iterable, Mapping
from urllib.parse import unquote, urlsplit

from labctl.core.proc import run
from labctl.core.ui import Report
from labctl.engine.detect import normalize_machine
from labctl.errors import CommandError, LabError

STAMP = "ddplab-wheelhouse.json"
MAX_ROUNDS = 4  # fetch what pip skipped, then check again; real dependency chains settle in one or two
OLDEST_GLIBC_MINOR = 17  # manylinux2014: older wheels than that have not been published for years



@dataclass(frozen=True)
class Target:
    """The interpreter and platform the node image installs wheels for (read off its base image)."""

    python: str = "3.11"  # major.minor
    implementation: str = "cp"
    glibc: str = "2.36"  # Debian bookworm
    machine: str = "x86_64"  # or aarch64: the engine's architecture

    @property
    def abi(self) -> str:
        return f"{self.implementation}{self.python.replace('.', '')}"

    def platforms(self) -> list[str]:
        """Every manylinux tag this glibc runs, newest first. pip matches tags literally and expands
        only the legacy manylinux2014/2010 names itself, so the PEP 600 names are spelled out."""
        major, minor = (int(x) for x in self.glibc.split(".")[:2])
        tags = [f"manylinux_{major}_{m}_{self.machine}" for m in range(minor, OLDEST_GLIBC_MINOR - 1, -1)]
        return tags + [f"manylinux2014_{self.machine}"]

    def markers(self) -> dict[str, str]:
        """PEP 508 marker values as the node's Python would report them."""
        return {
            "implementation_name": {"cp": "cpython"}.get(self.implementation, self.implementation),
            "platform_python_implementation": {"cp": "CPython"}.get(self.implementation, self.implementation),
            "python_version": self.python,
            "python_full_version": f"{self.python}.0",
            "implementation_version": f"{self.python}.0",
            "os_name": "posix",
            "sys_platform": "linux",
            "platform_system": "Linux",
            "platform_machine": self.machine,
            "platform_release": "",
            "platform_version": "",
            "extra": "",
        }

    def describe(self) -> str:
        return f"CPython {self.python}, manylinux glibc {self.glibc}, {self.machine}"


def target_from_probe(probe: Mapping[str, object]) -> Target:
    """The Target from what labctl/scripts/python_target.py printed inside the base image."""
    implementation = {"cpython": "cp"}.get(str(probe.get("implementation")), "")
    if not implementation:
        raise LabError(f"the base image's python3 is {probe.get('implementation')!r}, not CPython",
                       hint="use a CPython base image such as python:3.11-slim-bookworm (DDPLAB_BASE_IMAGE)")
    if probe.get("libc") != "glibc":
        raise LabError(f"the base image's C library is {probe.get('libc') or 'unknown'!r}, not glibc: torch publishes "
                       "no wheels for it", hint="use a Debian or Ubuntu based image (DDPLAB_BASE_IMAGE)")
    return Target(python=str(probe["python"]), implementation=implementation, glibc=str(probe["glibc"]),
                  machine=normalize_machine(str(probe["machine"])))


# ------------------------------------------------------------------------------------- pure


def pip_target_options(target: Target) -> list[str]:
    """What tells pip the node's interpreter and platform, whatever Python runs it."""
    argv = ["--quiet", "--disable-pip-version-check", "--only-binary=:all:", "--python-version", target.python,
            "--implementation", target.implementation, "--abi", target.abi]
    for platform in target.platforms():
        argv += ["--platform", platform]
    return argv


def pip_report_argv(python: str, target: Target, report: Path, requirements: Iterable[str]) -> list[str]:
    """`pip install --dry-run --report` of `requirements` for the node: what `pip download` would
    fetch, resolved from the index's metadata, with nothing downloaded or installed."""
    return [python, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--report", str(report),
            *pip_target_options(target), *requirements]


def report_wheels(report: dict) -> list[Wheel]:
    """The wheels of a pip installation report (its `install` items), as read_wheel reads a file."""
    from packaging.utils import canonicalize_name

    return [Wheel(unquote(urlsplit(item["download_info"]["url"]).path.rsplit("/", 1)[-1]),
                  canonicalize_name(item["metadata"]["name"]), str(item["metadata"]["version"]),
                  tuple(item["metadata"].get("requires_dist") or ())) for item in report.get("install", [])]


def pip_download_argv(python: str, target: Target, wheelhouse: Path, requirements: Iterable[str], *,
                      no_deps: bool = False, no_index: bool = False, index_url: str | None = None) -> list[str]:
    """`pip download` of `requirements` for the node's interpreter and platform, whatever `python`
    (the host's interpreter, whose pip does the work) is. Extra wheels come from the wheelhouse itself."""
    argv = [python, "-m", "pip", "download", *pip_target_options(target), "-d", str(wheelhouse),
            "--find-links", str(wheelhouse)]
    if no_deps:
        argv.append("--no-deps")
    if no_index:
        argv.append("--no-index")
    if index_url:
        argv += ["--index-url", index_url]
    return [*argv, *requirements]


@dataclass(frozen=True)
class Wheel:
    file: str
    name: str  # canonical
    version: str
    requires: tuple[str, ...]  # Requires-Dist lines, markers and all


def wheel_closure(wheels: Iterable[Wheel], roots: Iterable[str], target: Target) -> tuple[set[str], list[str]]:
    """(files the node needs, requirements nothing in `wheels` satisfies), evaluating every
    marker as the node's Python would: the dependency walk pip does, for the right interpreter."""
    # packaging (30 ms) is imported when a build walks wheels, not whenever labctl.image is imported
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    by_name: dict[str, list[Wheel]] = {}
    for wheel in wheels:
        by_name.setdefault(wheel.name, []).append(wheel)
    needed: set[str] = set()
    missing: list[str] = []
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [Requirement(r) for r in roots]
    while todo:
        req = todo.pop()
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        match = next((w for w in by_name.get(key[0], []) if req.specifier.contains(w.version, prereleases=True)), None)
        if match is None:
            missing.append(str(Requirement(f"{req.name}{req.specifier}")))
            continue
        needed.add(match.file)
        for line in match.requires:
            try:
                dep = Requirement(line)
            except InvalidRequirement:
                continue  # pip would have refused the wheel; nothing we can add
            extras = [""] + sorted(req.extras)
            if dep.marker is None or any(dep.marker.evaluate({**target.markers(), "extra": e}) for e in extras):
                todo.append(dep)
    return needed, sorted(set(missing))


# ------------------------------------------------------------------------------ side effects


def read_wheel(path: Path) -> Wheel:
    """Name, version and Requires-Dist of one wheel file, from its METADATA."""
    from packaging.utils import canonicalize_name, parse_wheel_filename

    name, version, _, _ = parse_wheel_filename(path.name)
    with zipfile.ZipFile(path) as archive:
        meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        headers = HeaderParser().parsestr(archive.read(meta).decode("utf-8", errors="replace"))
    return Wheel(path.name, canonicalize_name(name), str(version), tuple(headers.get_all("Requires-Dist") or ()))


def read_stamp(wheelhouse: Path) -> dict:
    try:
        return json.loads((wheelhouse / STAMP).read_text())
    except (OSError, ValueError):
        return {}


def settle(requirements: list[str], target: Target, ask: Callable[[list[str]], list[Wheel]],
           report: Report) -> tuple[set[str], list[Wheel]]:
    """Ask pip for `requirements` (`ask` returns every wheel it has given so far), then again for what
    the node needs and pip skipped, until nothing is missing: (the files the node needs, the wheels)."""
    wheels = ask(requirements)
    for _ in range(MAX_ROUNDS):
        needed, missing = wheel_closure(wheels, requirements, target)
        if not missing:
            return needed, wheels
        report(f"wheelhouse: pip skipped {', '.join(missing)} (it read their markers for this host's Python); "
               "asking for them")
        wheels = ask(missing)
    raise LabError(f"the wheelhouse for {target.describe()} still lacks {', '.join(missing)}",
                   hint=f"check that your package index has wheels of them for {target.abi} on {target.machine}")


def write_stamp(wheelhouse: Path, requirements: list[str], target: Target, wheels: Iterable[str]) -> list[str]:
    """Record what `wheelhouse` was made for and the wheels' names; returns the names, sorted."""
    names = sorted(wheels)
    stamp = {"requirements": requirements, "target": asdict(target), "wheels": names}
    (wheelhouse / STAMP).write_text(json.dumps(stamp, indent=1) + "\n")
    return names


def stamped_wheels(wheelhouse: Path, requirements: list[str], target: Target) -> list[str]:
    """The wheels' names where `wheelhouse` was made for the same requirements and target (the
    files may be pruned, or never fetched: their names stay in the stamp); [] where it must be made."""
    known = read_stamp(wheelhouse)
    if known.get("requirements") != requirements or known.get("target") != asdict(target):
        return []
    return known.get("wheels") or sorted(p.name for p in wheelhouse.glob("*.whl"))


def empty_wheelhouse(wheelhouse: Path) -> None:
    if wheelhouse.exists():
        shutil.rmtree(wheelhouse)
    wheelhouse.mkdir(parents=True)


def fill_wheelhouse(wheelhouse: Path, requirements: list[str], target: Target, report: Report, *,
                    cpu_index_url: str | None = None, timeout_s: float = 1800) -> list[str]:
    """Make `wheelhouse` hold exactly the wheels `requirements` need on `target`; returns their file
    names. Reused as is when it was filled for the same requirements and target.

    With `cpu_index_url`, the first requirement (torch) is fetched on its own first: from pip's
    local copies (find-links) if they have it for the node, else from that index. Plain PyPI would
    hand over torch's CUDA build, several GB.
    """
    names = stamped_wheels(wheelhouse, requirements, target)
    if names:
        return names
    empty_wheelhouse(wheelhouse)

    def pip(reqs: list[str], check: bool = True, **options):
        return run(pip_download_argv(sys.executable, target, wheelhouse, reqs, **options), check=check,
                   timeout_s=timeout_s)

    if cpu_index_url:
        torch = requirements[0]
        report(f"wheelhouse: looking for a local {torch} wheel for {target.describe()} (pip's find-links)")
        if pip([torch], check=False, no_deps=True, no_index=True).returncode != 0:
            report(f"wheelhouse: downloading {torch} (CPU build) from {cpu_index_url}")
            try:
                pip([torch], no_deps=True, index_url=cpu_index_url)
            except CommandError as exc:
                raise LabError(f"could not get a wheel of {torch} for {target.describe()}: {exc}",
                               hint="set DDPLAB_TORCH_INDEX_URL to an index with CPU builds, "
                                    "or put the wheel in PIP_FIND_LINKS") from None

    def fetch(reqs: list[str]) -> list[Wheel]:
        pip(reqs)
        return [read_wheel(p) for p in wheelhouse.glob("*.whl")]

    report(f"wheelhouse: downloading {', '.join(requirements)} and their dependencies for {target.describe()}")
    needed, wheels = settle(requirements, target, fetch, report)
    for wheel in wheels:
        if wheel.file not in needed:
            (wheelhouse / wheel.file).unlink()  # needed only by this host's Python, never by a node
    return write_stamp(wheelhouse, requirements, target, needed)


def resolve_wheelhouse(wheelhouse: Path, requirements: list[str], target: Target, report: Report, *,
                       timeout_s: float = 600) -> list[str]:
    """The file names `fill_wheelhouse` would fetch, resolved without fetching them: the stamp gets
    the names and the folder no wheel, as after a `build --lean`, so an image's hash costs no
    download and a build that needs the files fetches them (build_image). Reused when stamped."""
    names = stamped_wheels(wheelhouse, requirements, target)
    if names:
        return names
    empty_wheelhouse(wheelhouse)
    answer, asked = wheelhouse / "pip-report.json", []

    def resolve(reqs: list[str]) -> list[Wheel]:  # what pip skipped is resolved together with the rest
        asked.extend(reqs)
        run(pip_report_argv(sys.executable, target, answer, asked), timeout_s=timeout_s)
        return report_wheels(json.loads(answer.read_text()))

    report(f"wheelhouse: resolving {', '.join(requirements)} for {target.describe()} (names only, nothing downloaded)")
    needed, _ = settle(requirements, target, resolve, report)
    answer.unlink()
    return write_stamp(wheelhouse, requirements, target, needed)


def missing_wheels(wheelhouse: Path, names: Iterable[str]) -> list[str]:
    return [name for name in names if not (wheelhouse / name).is_file()]


def prune_wheelhouse(wheelhouse: Path) -> int:
    """Remove the wheel files but keep the stamp (`build --lean`): their names still make the image's
    hash, and a build that needs the files fetches them again. Returns the bytes freed. A stamp
    written before stamps named their wheels gets the names first; without a stamp nothing goes."""
    known = read_stamp(wheelhouse)
    files = sorted(wheelhouse.glob("*.whl"))
    if not known or not files:
        return 0
    if "wheels" not in known:
        write_stamp(wheelhouse, known["requirements"], Target(**known["target"]), (p.name for p in files))
    freed = 0
    for path in files:
        freed += path.stat().st_size
        path.unlink()
    return freed


def forget_wheelhouse(wheelhouse: Path) -> None:
    """Make the next fill_wheelhouse fetch everything again."""
    (wheelhouse / STAMP).unlink(missing_ok=True)
