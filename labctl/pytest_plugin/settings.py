"""The plugin's settings and a test's lab, as plain data: what the command line and the ini file
say (`Settings`), what a test's `@pytest.mark.ddplab(...)` asks for (`LabRequest`: a lab spec, the
type `labctl up` and `labctl.api.Lab` take, and the test's links), which labs may serve which tests
(`LabRequest.key`), and what labs are called.

Pure but for reading the workspace's .env: nothing here asks the engine anything; every value is
checked by labctl's own parsers, so a marker or an option says what it would have said to `labctl up`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Mapping

from labctl.errors import ConfigError, LabError
from labctl.net.tc import parse_shape
from labctl.spec.labspec import SETTINGS, LabSpec, checked_node_cpus, load_config

DEFAULT_NODES = 3
DEFAULT_RUN_TIMEOUT_S = 300.0  # every run through the fixture's lab; a hang fails its test, never the suite
NoEngine = Literal["fail", "skip"]
MARKER = "ddplab"
MARKER_DOC = ("ddplab(nodes=3, nproc_per_node=1, bw=None, delay=None, node_cpus=None, requirements=None, "
              "with_packages=(), preload=(), idle_imports=None, fresh=False): the lab the ddp_lab fixture hands this "
              "test; requirements (a file) and with_packages give its nodes your project's packages, as `labctl up "
              "--requirements/--with`; idle_imports='off' spares its fork servers torch._dynamo (`up --idle-imports`); "
              "bw and delay (either, or both) shape its links for this test alone, fresh=True gives it a lab no other "
              "test has used")
MARKER_KEYS = ("nodes", "nproc_per_node", "bw", "delay", "node_cpus", "requirements", "with_packages", "preload",
               "idle_imports", "fresh")
LAB_PREFIX = "pt"  # pt-<session8>-<worker>-<n>: a pytest session's labs, told apart at a glance in `labctl ls`


@dataclass(frozen=True, kw_only=True)
class Settings:
    """The plugin's defaults for the session (command line over ini file over these)."""

    nodes: int = DEFAULT_NODES
    """Nodes of a test's lab when its marker does not say."""
    image: str | None = None
    """Node image tag; None: labctl's (DDPLAB_IMAGE, else ddplab-node:torch<version>-cpu)."""
    run_timeout_s: float = DEFAULT_RUN_TIMEOUT_S
    """timeout_s of every run through the fixture's lab, unless the test gives its own."""
    keep_failed: bool = False
    """Keep the lab of a failed test (not reused, not removed) and say how to reach it."""
    no_engine: NoEngine = "fail"
    """What a test that uses the fixture does when no engine answers: fail (CI) or skip."""
    fresh: bool = False
    """A fresh lab for every test (no reuse): slower, for telling a test from its neighbours."""


@dataclass(frozen=True, kw_only=True)
class LabRequest:
    """What one test asks of its lab: the lab itself as a lab spec (labctl.spec.labspec.LabSpec, the one
    type `labctl up` and `labctl.api.Lab` take too), and what is the test's alone: its links and
    whether it may share the lab."""

    lab: LabSpec
    bw: str | None = None  # the links for this test alone: shaped before it, cleared after
    delay: str | None = None
    fresh: bool = False

    @property
    def key(self) -> tuple:
        """Labs with the same key are interchangeable between tests: what is fixed at `up`. The
        links are not part of it (set per test), nor `fresh` (a fresh lab is never pooled)."""
        return (self.lab.nodes, self.lab.nproc_per_node, self.lab.node_cpus, self.lab.image, self.lab.requirements,
                self.lab.with_packages, self.lab.preload, self.lab.idle_imports)

    @property
    def shaped(self) -> bool:
        return self.bw is not None or self.delay is not None

    def describe(self) -> str:
        parts = [f"{self.lab.nodes} nodes"]
        if self.lab.nproc_per_node != 1:
            parts.append(f"{self.lab.nproc_per_node} processes per node")
        if self.lab.node_cpus:
            parts.append("cpus " + ",".join(f"{n}={c:g}" for n, c in self.lab.node_cpus))
        if self.lab.requirements or self.lab.with_packages:
            parts.append("packages " + " ".join(filter(None, (self.lab.requirements, *self.lab.with_packages))))
        if self.shaped:
            parts.append("links " + " ".join(filter(None, (self.bw, self.delay and f"+{self.delay}"))))
        return ", ".join(parts)


# ------------------------------------------------------------------------------------ settings

def _positive_seconds(raw: Any, key: str) -> float:
    try:
        value = float(str(raw).strip())
    except ValueError:
        raise ConfigError(key, raw, "must be a number of seconds such as 300") from None
    if not 0 < value <= 86_400:
        raise ConfigError(key, raw, "must be more than 0 and at most 86400 seconds (a day)")
    return value


def _nodes(raw: Any, key: str) -> int:
    try:
        return SETTINGS["nodes"][1](str(raw))
    except ValueError as exc:
        raise ConfigError(key, raw, str(exc)) from None


def _flag(raw: Any, key: str) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("", "0", "false", "no", "off"):
        return False
    raise ConfigError(key, raw, "must be true or false")


def _image(raw: Any, key: str) -> str | None:
    text = str(raw).strip()
    if not text:
        return None
    try:
        return SETTINGS["image"][1](text)
    except ValueError as exc:
        raise ConfigError(key, raw, str(exc)) from None


def _no_engine(raw: Any, key: str) -> NoEngine:
    text = str(raw).strip().lower()
    if text not in ("fail", "skip"):
        raise ConfigError(key, raw, "must be fail (the default: a test that needs the lab fails without an engine) "
                                    "or skip")
    return text  # type: ignore[return-value]


# setting -> (command-line option, ini key, parser). The option wins over the ini file.
SETTING_SOURCES = {
    "nodes": ("--ddplab-nodes", "ddplab_nodes", _nodes),
    "image": ("--ddplab-image", "ddplab_image", _image),
    "run_timeout_s": ("--ddplab-run-timeout", "ddplab_run_timeout", _positive_seconds),
    "keep_failed": ("--ddplab-keep-failed", "ddplab_keep_failed", _flag),
    "no_engine": ("--ddplab-no-engine", "ddplab_no_engine", _no_engine),
    "fresh": ("--ddplab-fresh", "ddplab_fresh", _flag),
}


def resolve_settings(options: Mapping[str, Any], ini: Mapping[str, Any]) -> Settings:
    """Settings from the command line (`options`, by setting name, None where not given) over the
    ini file (`ini`, by setting name, None or "" where not set). A ConfigError names the option or
    ini key and the value."""
    values: dict[str, Any] = {}
    for name, (option, ini_key, parse) in SETTING_SOURCES.items():
        raw, key = options.get(name), option
        if raw is None:
            raw, key = ini.get(name), f"{ini_key} (ini)"
        if raw is None or (raw == "" and name != "image"):
            continue
        values[name] = parse(raw, key)
    return Settings(**values)


# -------------------------------------------------------------------------------------- marker

def lab_request(marks: list[tuple[tuple, Mapping[str, Any]]], settings: Settings, workspace: Path,
                environ: Mapping[str, str], root: Path | None = None) -> LabRequest:
    """A test's LabRequest from its `ddplab` markers, closest first (a test's own over its class's
    over its module's, key by key), over the session's settings. The lab's spec resolves as
    `labctl up`'s does: defaults, the workspace's .env, DDPLAB_* in `environ`, then these. A relative
    `requirements` file is taken from `root` (pytest's rootdir; default the workspace)."""
    merged: dict[str, Any] = {}
    for args, kwargs in reversed(marks):
        if args:
            raise LabError(f"@pytest.mark.{MARKER} takes keyword arguments only, got {args!r}",
                           hint=f"@pytest.mark.{MARKER}(nodes=3, bw='100mbit')")
        unknown = sorted(set(kwargs) - set(MARKER_KEYS))
        if unknown:
            raise LabError(f"@pytest.mark.{MARKER} has no argument {', '.join(unknown)}",
                           hint=f"it takes {', '.join(MARKER_KEYS)}")
        merged.update(kwargs)
    nodes = _nodes(merged["nodes"], f"{MARKER}(nodes=)") if merged.get("nodes") is not None else settings.nodes
    nproc = 1
    if merged.get("nproc_per_node") is not None:
        try:
            nproc = SETTINGS["nproc_per_node"][1](str(merged["nproc_per_node"]))
        except ValueError as exc:
            raise ConfigError(f"{MARKER}(nproc_per_node=)", merged["nproc_per_node"], str(exc)) from None
    bw, delay = merged.get("bw"), merged.get("delay")
    if bw is not None or delay is not None:
        # checked now: a typo fails before any lab (delay alone is latency shaping, netem at the root)
        parse_shape(None if bw is None else str(bw), None if delay is None else str(delay))
    given = {"nodes": nodes, "nproc_per_node": nproc, "node_cpus": dict(_node_cpus(merged.get("node_cpus"), nodes)),
             "image": settings.image, "requirements": _path(merged.get("requirements"), root or workspace),
             "with_packages": _listed(merged.get("with_packages")), "preload": _listed(merged.get("preload")),
             "idle_imports": _idle_imports(merged.get("idle_imports"))}
    lab = load_config(workspace, environ, {key: value for key, value in given.items() if value})
    return LabRequest(lab=lab, bw=None if bw is None else str(bw), delay=None if delay is None else str(delay),
                      fresh=_flag(merged.get("fresh", False), f"{MARKER}(fresh=)") or settings.fresh)


def _idle_imports(raw: Any) -> str | None:
    """A marker's idle_imports: 'on' or 'off' (True and False too), checked by `up`'s own parser."""
    if raw is None:
        return None
    value = {True: "on", False: "off"}.get(raw, raw) if isinstance(raw, bool) else str(raw)
    try:
        return SETTINGS["idle_imports"][1](value)
    except ValueError as exc:
        raise ConfigError(f"{MARKER}(idle_imports=)", raw, str(exc)) from None


def _path(raw: Any, root: Path) -> str | None:
    """A marker's file, relative to `root`; "none" and None as they are."""
    if raw is None or str(raw).strip().lower() in ("", "none"):
        return raw
    return str(root / Path(str(raw)).expanduser())


def _listed(raw: Any) -> tuple[str, ...] | None:
    """A marker's list argument: one string, or a list or tuple of them (None or empty: not given)."""
    if raw is None or raw == "":
        return None
    return (str(raw),) if isinstance(raw, str) else tuple(str(r) for r in raw) or None


def _node_cpus(raw: Any, nodes: int) -> tuple[tuple[str, float], ...]:
    if raw is None:
        return ()
    key = f"{MARKER}(node_cpus=)"
    if isinstance(raw, Mapping):
        raw = ",".join(f"{node}={cpus}" for node, cpus in raw.items())
    return tuple(sorted(checked_node_cpus(str(raw), nodes, key=key).items()))


# --------------------------------------------------------------------------------------- names

def worker_id(workerinput: Mapping[str, Any] | None) -> str:
    """This process's name among pytest-xdist's workers (`gw0`, ...), or `main` without xdist.
    From `config.workerinput`, which only a real worker has: an environment inherited from an
    outer xdist run (PYTEST_XDIST_WORKER) would make a plain session think it is a worker."""
    name = re.sub(r"[^a-z0-9]", "", str((workerinput or {}).get("workerid", "")).lower())[:8]
    return name or "main"


def lab_name(session: str, worker: str, number: int) -> str:
    """`pt-<session8>-<worker>-<n>`: unique to a session (a random id), a worker and a count, so
    two sessions, two workers of one session, or two labs of one worker never share a name."""
    name = f"{LAB_PREFIX}-{session[:8]}-{worker}-{number}"
    if not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,30}", name):
        raise ValueError(f"lab name {name!r} is not a valid lab name")  # a bug here, not the user's input
    return name
