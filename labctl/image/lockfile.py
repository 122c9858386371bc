"""The lab's lock: every package the nodes' Python sees, with the one wheel each installs and its
sha256, as a PEP 751 pylock.toml (.lab/<lab>/pylock.toml) written and read with `packaging.pylock`;
and what a node image still needs of it.

Pure: text in, text out (and one file read where a lab's lock is named).
"""

from __future__ import annotations

import hashlib
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Mapping
from urllib.parse import unquote, urlsplit

import tomli_w

from labctl.errors import LabError
from labctl.image.packages import TORCH, torch_refusal

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, before it joined the standard library
    import tomli as tomllib

if TYPE_CHECKING:
    from labctl.image.wheelhouse import Target

TOOL = "ddplab"  # the lock's [tool.ddplab] table: what it was made from


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
    return with_meta(pins, pylock.tool)


def with_meta(pins: Iterable[Pin], tool: Mapping | None) -> Lock:
    """A Lock of `pins`, with what its [tool.ddplab] table says it was made from."""
    meta = dict((tool or {}).get(TOOL) or {})
    return Lock(tuple(pins), str(meta.get("inputs", "")), tuple(meta.get("declared") or ()),
                str(meta.get("torch", "")), str(meta.get("target", "")))


def _wheel_version(filename: str) -> str:
    from packaging.utils import parse_wheel_filename

    return str(parse_wheel_filename(filename)[1])


def lock_from_report(items: Iterable[Mapping], needed: set[str]) -> list[Pin]:
    """Pins from a pip installation report's `install` items whose wheel file is in `needed` (what the
    node's markers leave: labctl.image.wheelhouse.wheel_closure)."""
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


def release(version: str | None) -> str | None:
    """A version without its local tag: torch "2.13.0+cpu" and the CUDA wheel's "2.13.0" (or "+cu128") are one
    release, built for different devices, and train together (gloo between them)."""
    return version.split("+", 1)[0] if version else version


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
        pins = [Pin(p["name"], p["version"], p["wheels"][0]["name"], p["wheels"][0].get("url", ""),
                    p["wheels"][0]["hashes"]["sha256"]) for p in data["packages"]]
    except OSError:
        return None
    except (tomllib.TOMLDecodeError, KeyError, IndexError, TypeError):
        return parse_lock(path.read_text(), str(path))
    return with_meta(pins, data.get("tool"))


def describe_lock_file(path: Path) -> str:
    """'PATH (packages 3fa2b1c9d0e1, 27 pinned)' for a lab's lock, read without parsing the TOML (a
    run's plan names it); "" where there is none."""
    try:
        text = path.read_text()
    except OSError:
        return ""
    digest = re.search(r'^digest = "([0-9a-f]{12})', text, re.M)
    return f"{path} (packages {digest.group(1) if digest else '?'}, {text.count('[[packages]]')} pinned)"
