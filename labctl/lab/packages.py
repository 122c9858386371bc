"""Your project's packages on every node, as data: what was declared, the lab's lock, and what pip's
refusals mean.

A lab declares its packages once (`up --requirements FILE --with PKG`): a requirements file, a
pyproject.toml (its `[project] dependencies`, or `pyproject.toml:GROUP` for one dependency group, as
pip's `--group` spells it) or a PEP 751 pylock.toml, and one-off requirements. The host's pip resolves
them once, for the node's interpreter and platform and together with the torch the lab pins
(labctl.lab.resolve), into the lab's lock: a pylock.toml with exact versions and sha256 hashes,
written and read with `packaging.pylock`. Every node then runs one image made from the lock
(labctl.lab.package_image), so every node has the same bytes.

Pure: files are read only where a declaration names them (`read_declaration`); pip runs elsewhere.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping
from urllib.parse import unquote, urlsplit

import tomli_w

from labctl.errors import ConfigError, LabError, StateError

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, before it joined the standard library
    import tomli as tomllib

if TYPE_CHECKING:
    from labctl.lab.wheelhouse import Target

LOCK_FILE = "pylock.toml"  # the lab's lock, in .lab/<lab>/
LABEL_PACKAGES = "io.ddplab.packages"  # on a package image (and so its containers): the lock's digest
LABEL_PACKAGES_BASE = "io.ddplab.packages-base"  # the id of the node image it was made on
TAG_MARK = "-pkgs-"  # ddplab-node:torch2.13.0-cpu-pkgs-<digest12>
TOOL = "ddplab"
TORCH = "torch"
INCLUDE_RE = re.compile(r"^\s*(-r|--requirement|-c|--constraint)(\s+|=)(\S+)")


# ------------------------------------------------------------------------------- declaration


@dataclass(frozen=True)
class Declaration:
    """The packages a lab asks for, as given: a file (requirements, pyproject or pylock) and one-off
    requirements. `shown` says it back in an error or a report."""

    file: Path | None = None  # absolute
    group: str | None = None  # a pyproject.toml's dependency group
    extra: tuple[str, ...] = ()  # --with

    @property
    def kind(self) -> str | None:
        if self.file is None:
            return None
        if self.file.name == "pyproject.toml":
            return "pyproject"
        from packaging.pylock import is_valid_pylock_path

        return "pylock" if is_valid_pylock_path(self.file) else "requirements"

    @property
    def declared(self) -> tuple[str, ...]:
        """What was asked for: the file (with its group) and each one-off requirement."""
        return ((f"{self.file}{':' + self.group if self.group else ''}",) if self.file else ()) + self.extra

    @property
    def shown(self) -> str:
        given = [self.declared[0]] if self.file else []
        return " ".join(given + [f"--with {r}" for r in self.extra])


def read_declaration(requirements: str, extra: Iterable[str], workspace: Path, key: str = "--requirements",
                     source: str = "") -> Declaration | None:
    """The declaration of `requirements` (a path relative to `workspace`, maybe `PATH:GROUP`) and the
    `extra` requirements; None for none. A missing file, or a group without a pyproject.toml, is refused."""
    extra = tuple(extra)
    if not requirements:
        return Declaration(extra=extra) if extra else None
    path, group = Path(requirements).expanduser(), None
    head, sep, tail = requirements.rpartition(":")
    if sep and head.endswith(".toml") and not (workspace / path).is_file():
        path, group = Path(head).expanduser(), tail
    path = (workspace / path).resolve()
    if not path.is_file():
        near = sorted(p.name for p in path.parent.glob("*") if p.suffix in (".txt", ".toml", ".in"))[:8] \
            if path.parent.is_dir() else []
        raise ConfigError(key, requirements, f"no such file ({path})", source,
                          hint=f"files there: {', '.join(near)}" if near else
                          "give a requirements file, a pyproject.toml[:GROUP] or a pylock.toml")
    declaration = Declaration(path, group or None, extra)
    if group and declaration.kind != "pyproject":
        raise ConfigError(key, requirements, f"names the group {group!r}, but only a pyproject.toml has groups",
                          source, hint="give pyproject.toml:GROUP, or the file alone")
    return declaration


def pyproject_requirements(declaration: Declaration) -> list[str]:
    """The requirement strings of a pyproject.toml: its [project] dependencies, or the named dependency
    group (PEP 735, its includes resolved by `packaging.dependency_groups`)."""
    from packaging.dependency_groups import resolve_dependency_groups

    data = read_toml(declaration.file)
    if declaration.group:
        groups = data.get("dependency-groups") or {}
        if declaration.group not in groups:
            raise LabError(f"{declaration.file} has no dependency group {declaration.group!r}",
                           hint=f"its groups: {', '.join(groups) or 'none'} ([dependency-groups])")
        try:
            return [str(r) for r in resolve_dependency_groups(groups, declaration.group)]
        except (ValueError, TypeError) as exc:
            raise LabError(f"{declaration.file}: dependency group {declaration.group!r}: {exc}") from None
    dependencies = (data.get("project") or {}).get("dependencies")
    if dependencies is None:
        groups = ", ".join(data.get("dependency-groups") or {}) or "none"
        raise LabError(f"{declaration.file} has no [project] dependencies",
                       hint=f"name a dependency group as {declaration.file.name}:GROUP (its groups: {groups})")
    return [str(d) for d in dependencies]


def read_toml(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise LabError(f"cannot read {path}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise LabError(f"{path} is not valid TOML: {exc}") from None


def checked_requirements(lines: Iterable[str], where: str) -> list[str]:
    """Requirement strings checked by `packaging`, as pip would parse them: a bad one is named with `where`."""
    from packaging.requirements import InvalidRequirement, Requirement

    out = []
    for line in lines:
        try:
            requirement = Requirement(line)
        except InvalidRequirement as exc:
            raise LabError(f"{where}: {line!r} is not a requirement: {exc}") from None
        if requirement.url:
            raise LabError(f"{where}: {line!r} names a URL; the nodes install released wheels from the package index",
                           hint="your own code is in the workspace, which every node mounts; publish or drop the rest")
        out.append(str(requirement))
    return out


def check_torch(requirements: Iterable[str], pinned: str, where: str) -> None:
    """Refuse a requirement of torch that the lab's pinned release does not satisfy, before pip runs."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    for line in requirements:
        requirement = Requirement(line)
        if canonicalize_name(requirement.name) == TORCH and not requirement.specifier.contains(pinned, prereleases=True):
            raise torch_refusal(f"{where} asks for {requirement}", pinned, f"torch{requirement.specifier}")


def torch_refusal(who: str, pinned: str, wanted: str) -> LabError:
    other = re.search(r"\d+\.\d+\.\d+", wanted)
    version = other.group(0) if other else "X.Y.Z"
    return LabError(f"{who}, but this lab's nodes run torch {pinned}: torch stays what the lab pins",
                    hint=f"--torch-version {version} (DDPLAB_TORCH_VERSION) brings the lab up on another release, its "
                         f"node image built first; or ask for a version that works with torch {pinned}")


def input_files(declaration: Declaration) -> list[Path]:
    """The declaration's file and, for a requirements file, every file it names with -r or -c."""
    if declaration.file is None:
        return []
    files, todo = [], [declaration.file]
    while todo:
        path = todo.pop()
        if path in files or not path.is_file():
            continue
        files.append(path)
        if declaration.kind == "requirements":
            for line in path.read_text(errors="replace").splitlines():
                match = INCLUDE_RE.match(line)
                if match:
                    todo.append((path.parent / match.group(3)).resolve())
    return files


def inputs_digest(declaration: Declaration, torch: str, target: Target) -> str:
    """What the lock is resolved from, hashed: the same digest means the same lock may be reused
    (offline, tomorrow) instead of asking the index again."""
    digest = hashlib.sha256()
    parts: dict[str, Any] = {"kind": declaration.kind, "group": declaration.group, "extra": list(declaration.extra),
                             "torch": torch, "target": asdict(target), "format": 1}
    digest.update(json.dumps(parts, sort_keys=True).encode())
    for path in input_files(declaration):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:24]


# ------------------------------------------------------------------------------------- lock


@dataclass(frozen=True, order=True)
class Pin:
    """One package of a lock: the exact version and the one wheel the node installs."""

    name: str  # canonical
    version: str
    wheel: str  # its file name
    url: str = ""
    sha256: str = ""

    @property
    def line(self) -> str:
        return f"{self.name}=={self.version}"


@dataclass(frozen=True)
class Lock:
    """The lab's lock: every package the nodes' Python sees besides the installer's own, torch and its
    dependencies included, with what it was made from ([tool.ddplab] in the file)."""

    pins: tuple[Pin, ...]
    inputs: str = ""  # inputs_digest
    declared: tuple[str, ...] = ()  # what was asked for, as given
    torch: str = ""  # the release the lab pins
    target: str = ""  # the node's Python, as Target.describe() says it
    meta: Mapping[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "pins", tuple(sorted(self.pins)))  # one order, whoever made it

    @property
    def digest(self) -> str:
        """The package set's hash: names, versions and wheels' hashes, whatever else the file says."""
        lines = sorted(f"{p.name}=={p.version} {p.sha256}" for p in self.pins)
        return hashlib.sha256("\n".join(lines).encode()).hexdigest()

    @property
    def short(self) -> str:
        return self.digest[:12]

    def versions(self) -> dict[str, str]:
        return {p.name: p.version for p in self.pins}

    def pin(self, name: str) -> Pin | None:
        return next((p for p in self.pins if p.name == name), None)


def target_tags(target: Target) -> list:
    """The wheel tags the node's Python takes, best first (packaging.tags, for another interpreter)."""
    from packaging.tags import compatible_tags, cpython_tags

    version = tuple(int(x) for x in target.python.split("."))
    platforms = target.platforms()
    return [*cpython_tags(version, abis=[target.abi], platforms=platforms),
            *compatible_tags(version, interpreter=target.abi, platforms=platforms)]


def render_lock(lock: Lock, target: Target) -> str:
    """The lock as a PEP 751 pylock.toml for one environment, the node's (packaging.pylock, tomli_w)."""
    from packaging.markers import Marker
    from packaging.pylock import Package, PackageWheel, Pylock
    from packaging.specifiers import SpecifierSet
    from packaging.utils import canonicalize_name
    from packaging.version import Version

    environment = (f"sys_platform == 'linux' and platform_machine == '{target.machine}' and "
                   f"implementation_name == '{target.markers()['implementation_name']}' and "
                   f"python_version == '{target.python}'")
    packages = [Package(name=canonicalize_name(p.name), version=Version(p.version),
                        wheels=[PackageWheel(name=p.wheel, url=p.url or None, path=None if p.url else p.wheel,
                                             hashes={"sha256": p.sha256})])
                for p in sorted(lock.pins)]
    tool = {TOOL: {"inputs": lock.inputs, "declared": list(lock.declared), "torch": lock.torch, "target": lock.target,
                   "digest": lock.digest}}
    pylock = Pylock(lock_version=Version("1.0"), environments=[Marker(environment)],
                    requires_python=SpecifierSet(f"=={target.python}.*"), created_by="ddplab", packages=packages,
                    tool=tool)
    pylock.validate()
    header = ("# The lab's packages, resolved once on the host for the nodes' Python (labctl up --requirements/--with).\n"
              "# Every node runs one image made from this file; `labctl doctor` compares each node with it.\n")
    return header + tomli_w.dumps(dict(pylock.to_dict()))


def parse_lock(text: str, source: str, target: Target | None = None) -> Lock:
    """A pylock.toml (the lab's own, or one the user gives) as the node installs it: the one wheel
    `packaging.pylock` selects for the node's Python (`target`) from every package that applies to it.
    Without `target`: every package, each with its one wheel (a lock made for one environment)."""
    from packaging.pylock import PackageWheel, Pylock, PylockSelectError, PylockValidationError

    try:
        pylock = Pylock.from_dict(tomllib.loads(text))
        if target is None:
            chosen = [(p, p.wheels[0] if p.wheels and len(p.wheels) == 1 else p) for p in pylock.packages]
        else:
            chosen = list(pylock.select(environment=dict(target.markers()), tags=target_tags(target)))
    except tomllib.TOMLDecodeError as exc:
        raise LabError(f"{source} is not valid TOML: {exc}") from None
    except PylockValidationError as exc:
        raise LabError(f"{source} is not a valid pylock.toml (PEP 751): {exc}") from None
    except PylockSelectError as exc:
        raise LabError(f"{source} has nothing the nodes can install ({target.describe() if target else ''}): {exc}",
                       hint="lock for Linux and the nodes' Python, e.g. `uv pip compile --python-platform "
                            f"{target.machine}-manylinux_2_28 --python-version {target.python} -o pylock.toml`") from None
    pins = []
    node = target.describe() if target else "the nodes"
    for package, distribution in chosen:
        if not isinstance(distribution, PackageWheel):
            kind = type(distribution).__name__.removeprefix("Package").lower()
            raise LabError(f"{source}: {package.name} comes as a {kind}, not one wheel; the nodes install wheels only",
                           hint=f"lock a version of {package.name} that publishes a wheel for {node}")
        sha256 = distribution.hashes.get("sha256", "")
        if not sha256:
            raise LabError(f"{source}: the wheel of {package.name} has no sha256 hash (it has "
                           f"{', '.join(distribution.hashes) or 'none'}); the nodes install only what they can verify")
        pins.append(Pin(package.name, str(package.version or _wheel_version(distribution.filename)),
                        distribution.filename, distribution.url or "", sha256))
    meta = dict((pylock.tool or {}).get(TOOL) or {})
    return Lock(tuple(sorted(pins)), str(meta.get("inputs", "")), tuple(meta.get("declared") or ()),
                str(meta.get("torch", "")), str(meta.get("target", "")), meta)


def _wheel_version(filename: str) -> str:
    from packaging.utils import parse_wheel_filename

    return str(parse_wheel_filename(filename)[1])


def lock_from_report(items: Iterable[Mapping], needed: set[str]) -> list[Pin]:
    """Pins from a pip installation report's `install` items whose wheel file is in `needed` (what the
    node's markers leave: labctl.lab.wheelhouse.wheel_closure)."""
    from packaging.utils import canonicalize_name

    pins = []
    for item in items:
        info = item.get("download_info") or {}
        url = info.get("url", "")
        wheel = unquote(urlsplit(url).path.rsplit("/", 1)[-1])
        if wheel not in needed:
            continue
        archive = info.get("archive_info") or {}
        sha256 = (archive.get("hashes") or {}).get("sha256") or (archive.get("hash") or "").partition("sha256=")[2]
        pins.append(Pin(canonicalize_name(item["metadata"]["name"]), str(item["metadata"]["version"]), wheel, url,
                        sha256))
    return sorted(pins)


def hash_requirements(pins: Iterable[Pin]) -> str:
    """What pip installs in hash-checking mode: each pin with its wheel's sha256 (pip refuses any other bytes)."""
    return "".join(f"{p.line} --hash=sha256:{p.sha256}\n" for p in sorted(pins))


def same_version(a: str | None, b: str | None) -> bool:
    """Two versions as PEP 440 compares them (2.13.0 and 2.13 agree); torch's local label counts."""
    if a is None or b is None:
        return a == b
    from packaging.version import InvalidVersion, Version

    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def release(version: str) -> str:
    return version.split("+", 1)[0]


def to_install(lock: Lock, installed: Mapping[str, str]) -> list[Pin]:
    """What an image must get to match the lock: every pin its Python does not already have at that
    version (`installed`: canonical name -> version). torch is the image's own and never installed; a
    lock made for another torch release is refused."""
    torch = lock.pin(TORCH)
    have = installed.get(TORCH)
    if torch and have and not same_version(release(torch.version), release(have)):
        raise torch_refusal(f"the lock asks for torch {torch.version}", release(have), f"torch=={torch.version}")
    return [p for p in lock.pins if p.name != TORCH and not same_version(installed.get(p.name), p.version)]


def read_lab_lock(path: Path) -> Lock | None:
    """A lock this module wrote (the lab's .lab/<lab>/pylock.toml), or None where there is none: read
    with tomllib alone, since every run's preflight reads it and packaging.pylock's checks (and
    imports) cost tens of milliseconds; a file that is not one is read with them, and refused."""
    try:
        data = tomllib.loads(path.read_text())
        meta = dict((data.get("tool") or {}).get(TOOL) or {})
        pins = [Pin(p["name"], p["version"], p["wheels"][0]["name"], p["wheels"][0].get("url", ""),
                    p["wheels"][0]["hashes"]["sha256"]) for p in data["packages"]]
    except OSError:
        return None
    except (tomllib.TOMLDecodeError, KeyError, IndexError, TypeError):
        return parse_lock(path.read_text(), str(path))
    return Lock(tuple(sorted(pins)), str(meta.get("inputs", "")), tuple(meta.get("declared") or ()),
                str(meta.get("torch", "")), str(meta.get("target", "")), meta)


def describe_lock_file(path: Path) -> str:
    """'PATH (packages 3fa2b1c9d0e1, 27 pinned)' for a lab's lock, read without parsing the TOML (a
    run's plan names it); "" where there is none."""
    try:
        text = path.read_text()
    except OSError:
        return ""
    digest = re.search(r'^digest = "([0-9a-f]{12})', text, re.M)
    return f"{path} (packages {digest.group(1) if digest else '?'}, {text.count('[[packages]]')} pinned)"


# ------------------------------------------------------------------------------ image tags


def package_tag(base: str, digest: str) -> str:
    """The tag of the package image made from `base` for the lock with `digest`."""
    repository, _, tag = base.rpartition(":") if ":" in base.rsplit("/", 1)[-1] else (base, "", "latest")
    return f"{repository}:{tag}{TAG_MARK}{digest[:12]}"


def base_of(image: str) -> str:
    """The node image a package image was made on (itself for any other image)."""
    return image.split(TAG_MARK, 1)[0]


# --------------------------------------------------------------------------- pip's refusals

_NOT_FOUND = re.compile(r"Could not find a version that satisfies the requirement (\S+) \(from versions: ([^)]*)\)")
_BAD_LINE = re.compile(r"Invalid requirement: (.*?)(?:\n\s+.*?)*?\(from line (\d+) of (.+?)\)", re.S)
_DEPENDS = re.compile(r"^\s*(\S+) (\S+) depends on torch(\S*)", re.M)
_USER_TORCH = re.compile(r"^\s*The user requested torch(\S+)$", re.M)
_CONFLICT = re.compile(r"The conflict is caused by:\n((?:[ \t]+\S.*\n?)+)")
# What pip's warnings say when no index answered (it retries, and says why, before giving up).
UNREACHABLE = ("after connection broken by", "Failed to establish a new connection", "NewConnectionError",
               "NameResolutionError", "Max retries exceeded", "Temporary failure in name resolution",
               "Name or service not known", "Network is unreachable", "ProxyError", "ConnectTimeout",
               "Could not fetch URL")


def explain_pip_failure(output: str, target: Target, pinned: str, cached: Iterable[str] = ()) -> LabError | None:
    """What pip's refusal to resolve (its stdout and stderr) means for the user, as the project's
    error: bad input (exit 2) or no index to ask (exit 1); None where pip said something else."""
    if any(marker in output for marker in UNREACHABLE):
        wanted = sorted({match[0] for match in _NOT_FOUND.findall(output)}) or ["the packages"]
        have = sorted(cached)
        shown = f"the wheels cached here: {', '.join(have[:12])}; " if have else ""
        return StateError(f"no package index answers, and no cached wheel has {', '.join(wanted)} for the nodes "
                          f"({target.describe()})",
                          hint=f"{shown}check pip's index (PIP_INDEX_URL, pip.conf) and the network; a lock resolved "
                               "before works offline from its cached wheels")
    bad = _BAD_LINE.search(output)
    if bad:
        message = " ".join(bad.group(1).split())
        return LabError(f"{bad.group(3)} line {bad.group(2)}: {message}",
                        hint="one requirement per line, as pip takes them: NAME[EXTRAS][SPECIFIER][; MARKER]")
    conflict = torch_conflict(output, pinned)
    if conflict:
        return conflict
    found = _NOT_FOUND.search(output)
    if found:
        name, versions = found.group(1), [v.strip() for v in found.group(2).split(",") if v.strip()]
        if versions == ["none"] or not versions:
            return LabError(f"the package index has no wheel of {name} for the nodes ({target.describe()}): the name "
                            f"may be misspelt, or {name} publishes only source distributions or wheels for other "
                            "platforms", hint=f"check the name (`pip index versions {name}`); the nodes install "
                                              "wheels only")
        shown = ", ".join(versions[-6:])
        bare = re.split(r"[<>=!~;\[ ]", name, maxsplit=1)[0]
        return LabError(f"no version of {name} on the package index matches: it offers {len(versions)} versions, the "
                        f"latest {shown}", hint=f"ask for one of them, e.g. {bare}=={versions[-1]}")
    caused = _CONFLICT.search(output)
    if caused:
        lines = [" ".join(line.split()) for line in caused.group(1).splitlines() if line.strip()]
        return LabError("pip cannot satisfy the requirements together: " + "; ".join(lines),
                        hint="loosen one of them; `pip install --dry-run` of the same requirements shows the same")
    return None


def torch_conflict(output: str, pinned: str) -> LabError | None:
    """A requirement that needs another torch than the lab's, from pip's "conflict is caused by"."""
    if "conflict is caused by" not in output:
        return None
    for name, version, spec in _DEPENDS.findall(output):
        return torch_refusal(f"{name} {version} needs torch{spec}", pinned, f"torch{spec}")
    for spec in _USER_TORCH.findall(output):
        if spec != f"=={pinned}":
            return torch_refusal(f"the requirements ask for torch{spec}", pinned, f"torch{spec}")
    return None
