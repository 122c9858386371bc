"""Your project's packages on every node: what a lab declares, and the names its package images get.

A lab declares its packages once (`up --requirements FILE --with PKG`): a requirements file, a
pyproject.toml (its `[project] dependencies`, or `pyproject.toml:GROUP` for one dependency group, as
pip's `--group` spells it) or a PEP 751 pylock.toml, and one-off requirements. The host's pip resolves
them once, for the node's interpreter and platform and together with the torch the lab pins
(labctl.image.resolve; what its refusals mean: labctl.image.piperrors), into the lab's lock
(labctl.image.lockfile). Every node then runs one image made from the lock (labctl.image.package_image),
so every node has the same bytes.

Pure: files are read only where a declaration names them (`read_declaration`); pip runs elsewhere.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from labctl.errors import ConfigError, LabError

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, before it joined the standard library
    import tomli as tomllib

if TYPE_CHECKING:
    from labctl.image.wheelhouse import Target

LOCK_FILE = "pylock.toml"  # the lab's lock, in .lab/<lab>/
LABEL_PACKAGES = "io.ddplab.packages"  # on a package image (and so its containers): the lock's digest
LABEL_PACKAGES_BASE = "io.ddplab.packages-base"  # the id of the node image it was made on
TAG_MARK = "-pkgs-"  # ddplab-node:torch2.13.0-cpu-pkgs-<digest12>
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


# ------------------------------------------------------------------------------ image tags


def package_tag(base: str, digest: str) -> str:
    """The tag of the package image made from `base` for the lock with `digest`."""
    repository, _, tag = base.rpartition(":") if ":" in base.rsplit("/", 1)[-1] else (base, "", "latest")
    return f"{repository}:{tag}{TAG_MARK}{digest[:12]}"


def base_of(image: str) -> str:
    """The node image a package image was made on (itself for any other image)."""
    return image.split(TAG_MARK, 1)[0]
