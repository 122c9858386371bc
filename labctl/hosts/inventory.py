"""The inventory: real machines (or the lab's nodes seen as machines) that `labctl hosts` drives over SSH.

A TOML file. Every host setting can be given once under [defaults] and overridden per host:

    name = "cluster"            # names .lab/<name>/ (logs) and the rendezvous; default: the file's stem
    master_port = 29500         # the rendezvous port on the first host

    [defaults]
    user = "me"
    iface = "tailscale0"
    venv = "~/venvs/torch"      # or python = "/usr/bin/python3"

    [[hosts]]                   # in node-rank order: the first one hosts the rendezvous
    name = "workstation"
    address = "100.101.1.5"
    nproc_per_node = 2

    [[hosts]]
    name = "laptop"
    address = "100.101.1.6"
    iface = "wlan0"

Pure: `parse_inventory` takes the text and returns frozen dataclasses or raises ConfigError naming the
file, the host, the key, the value and what is allowed; `load_inventory` is the only function that
reads a file.
"""

from __future__ import annotations

import difflib
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Mapping

import tomli_w

from labctl.errors import ConfigError, LabError, StateError
from labctl.lab.envfiles import (
    Topology,
    build_env_files,
    build_node_env,
    is_host_address,
)
from labctl.spec.labspec import SETTINGS
from labctl.spec.parsers import int_in, matching

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, before it joined the standard library
    import tomli as tomllib

DEFAULT_WORKSPACE = "ddplab-workspace"  # relative: under the user's home on each host
DEFAULT_PYTHON = "python3"
_USER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}$")
_ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# What a host's env file sets: the inventory's `env` may not override a node's identity.
RESERVED_ENV = frozenset(build_node_env(Topology.uniform(("h",), iface="i", nproc_per_node=1, master_port=1,
                                                          rdzv_id="r"), 0))


@dataclass(frozen=True, kw_only=True)
class Host:
    """One machine: where to reach it, and how to run the job there."""

    name: str
    """How logs and output call it (node<i> unless given)."""
    address: str
    """What SSH dials and, for the first host, where the others find the rendezvous store."""
    iface: str
    """The interface that carries the traffic between the hosts: GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME."""
    user: str | None = None
    """SSH user; None: ssh's own choice (your ~/.ssh/config, or your local user name)."""
    port: int = 22
    """SSH port."""
    identity_file: Path | None = None
    """Private key for SSH; None: ssh's own choice (agent, ~/.ssh/id_*)."""
    known_hosts: Path | None = None
    """The known_hosts file that host keys are checked against; None: ~/.ssh/known_hosts."""
    nproc_per_node: int = 1
    """Processes torchrun starts on this host."""
    python: str = DEFAULT_PYTHON
    """The Python on the host that has torch (a venv's bin/python, say)."""
    workspace: str = DEFAULT_WORKSPACE
    """Where `hosts sync` puts the workspace and runs start; relative paths are under the SSH user's home."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment for the job on this host (NCCL_DEBUG=INFO, OMP_NUM_THREADS=4, ...)."""

    @property
    def bracketed_address(self) -> str:
        """The address as it goes before ':port' or ':path' (an IPv6 address in brackets)."""
        return f"[{self.address}]" if ":" in self.address else self.address

    @property
    def ssh_command(self) -> str:
        """The plain ssh command a person would type to reach the host (for hints)."""
        return shlex.join(["ssh", "-p", str(self.port), f"{self.user}@{self.address}" if self.user else self.address])

    @property
    def known_hosts_name(self) -> str:
        """How ssh names the host in known_hosts: the address, or [address]:port off port 22."""
        return self.address if self.port == 22 else f"[{self.address}]:{self.port}"

    @property
    def destination(self) -> str:
        """user@address:port, for people."""
        user = f"{self.user}@" if self.user else ""
        return f"{user}{self.bracketed_address}:{self.port}"


@dataclass(frozen=True, kw_only=True)
class Inventory:
    path: Path
    name: str
    """Names .lab/<name>/ in the workspace (runs and their logs) and the rendezvous."""
    master_port: int
    hosts: tuple[Host, ...]

    @property
    def names(self) -> list[str]:
        return [h.name for h in self.hosts]

    @property
    def state_dir(self) -> str:
        """Where labctl keeps the hosts' env files, runs and packages, relative to a workspace: .lab/<name>."""
        return f".lab/{self.name}"

    def host(self, name: str) -> Host:
        return next(h for h in self.hosts if h.name == name)

    def topology(self, nproc_per_node: int | None = None) -> Topology:
        return Topology(addresses=tuple(h.address for h in self.hosts), ifaces=tuple(h.iface for h in self.hosts),
                        nprocs=tuple(nproc_per_node or h.nproc_per_node for h in self.hosts),
                        master_port=self.master_port, rdzv_id=self.name)

    def env_files(self, nproc_per_node: int | None = None) -> dict[str, str]:
        """Host name -> the text of its env file (the same files `labctl env` writes)."""
        files = build_env_files(self.topology(nproc_per_node), self.names)
        return {name: files[f"{name}.env"] for name in self.names}


# ------------------------------------------------------------------------------------- parsing

TOP_KEYS = ("name", "master_port", "defaults", "hosts")
HOST_KEYS = ("name", "address", "user", "port", "identity_file", "known_hosts", "iface", "nproc_per_node", "python",
             "venv", "workspace", "env")
DEFAULT_KEYS = tuple(k for k in HOST_KEYS if k not in ("name", "address"))


def _unknown(keys, allowed, where: str, source: str) -> None:
    for key in keys:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            raise LabError(f"{source}: unknown setting {where}{key}; allowed here: {', '.join(allowed)}",
                           hint=f"did you mean {close[0]!r}?" if close else None)


def _typed(kind: type, parse: Callable[[Any], Any] | None = None):
    """A checker: the TOML value must be of `kind` (a whole number is not a bool), then `parse` it."""

    def check(value: Any) -> Any:
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ValueError(f"must be {'a whole number' if kind is int else 'a string'}")
        return parse(value) if parse else value

    return check


def _setting(name: str) -> Callable[[str], Any]:
    return SETTINGS[name][1]


def _address(value: str) -> str:
    value = value.strip()
    if not is_host_address(value):
        raise ValueError("must be an IP address or a hostname")
    return value


def _workspace(value: str) -> str:
    """Absolute, or relative to the SSH user's home ('~/x' is 'x'): ssh and rsync both read it so."""
    value = value.strip()
    if value.startswith("~/"):
        value = value[2:]
    path = PurePosixPath(value)
    if value in ("", "~", ".") or str(path) == "/" or ".." in path.parts:
        raise ValueError("must be a directory of its own for the job, such as ddplab-workspace or /srv/ddplab "
                         "(not the home directory, /, or a path with ..): `hosts sync` mirrors the workspace into it")
    return str(path)


def _nonempty(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    return value.strip()


def _env(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise ValueError('must be a table of strings, e.g. { NCCL_DEBUG = "INFO" }')
    out = {}
    for key, item in value.items():
        if not _ENV_KEY_RE.match(key):
            raise ValueError(f"{key!r} is not an environment variable name")
        if key in RESERVED_ENV:
            raise ValueError(f"{key} is part of each host's identity, which labctl writes from the inventory")
        if not isinstance(item, str):
            raise ValueError(f"{key} must be a string (write {key} = \"{item}\")")
        out[key] = item
    return out


CHECKS: dict[str, Callable[[Any], Any]] = {
    "name": _typed(str, _setting("lab")),
    "address": _typed(str, _address),
    "user": _typed(str, matching(_USER_RE, "must be a user name such as ubuntu or me")),
    "port": _typed(int, int_in(1, 65535)),
    "identity_file": _typed(str, _nonempty),
    "known_hosts": _typed(str, _nonempty),
    "iface": _typed(str, _setting("iface")),
    "nproc_per_node": _typed(int, _setting("nproc_per_node")),
    "python": _typed(str, _nonempty),
    "venv": _typed(str, _nonempty),
    "workspace": _typed(str, _workspace),
    "env": _env,
}


def _checked(table: Mapping[str, Any], where: str, source: str) -> dict[str, Any]:
    out = {}
    for key, value in table.items():
        try:
            out[key] = CHECKS[key](value)
        except ValueError as exc:
            raise ConfigError(f"{where}{key}", value, str(exc), source) from None
    if "python" in out and "venv" in out:
        raise ConfigError(f"{where}venv", out["venv"], "give python or venv, not both", source)
    return out


def _local_path(text: str, base: Path) -> Path:
    path = Path(text).expanduser()
    return path if path.is_absolute() else base / path


def _host(merged: dict[str, Any], index: int, base: Path, where: str, source: str) -> Host:
    if "address" not in merged:
        raise ConfigError(f"{where}address", None, "is required: the IP address or hostname SSH dials", source)
    if "iface" not in merged:
        raise ConfigError(f"{where}iface", None, "is required (here or under [defaults]): the interface that carries "
                          "the traffic between the hosts, e.g. tailscale0 or eth0", source,
                          hint=f"on another host, `ip route get {merged['address']}` names it")
    values = {k: v for k, v in merged.items() if k not in ("venv", "identity_file", "known_hosts")}
    values.setdefault("name", f"node{index}")
    if "venv" in merged:
        values["python"] = str(PurePosixPath(merged["venv"]) / "bin" / "python")
    for key in ("identity_file", "known_hosts"):
        if key in merged:
            values[key] = _local_path(merged[key], base)
    return Host(**values)


def parse_inventory(text: str, path: Path) -> Inventory:
    """The inventory in `text` (read from `path`, which names it and anchors its relative paths)."""
    source = str(path)
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise LabError(f"{path} is not valid TOML: {exc}", hint="see https://toml.io; `labctl up --ssh` writes an "
                       "example at .lab/<lab>/hosts.toml") from None
    _unknown(doc, TOP_KEYS, "", source)
    name = _checked({"name": doc["name"]}, "", source)["name"] if "name" in doc else path.stem.lower()
    try:
        _setting("lab")(name)
    except ValueError as exc:
        raise ConfigError("name", name, f"{exc} (it names .lab/<name>/)", source,
                          hint='set name = "cluster" at the top of the file') from None
    try:
        master_port = _typed(int, _setting("master_port"))(doc.get("master_port", 29500))
    except ValueError as exc:
        raise ConfigError("master_port", doc.get("master_port"), str(exc), source) from None
    defaults = doc.get("defaults", {})
    if not isinstance(defaults, dict):
        raise ConfigError("defaults", defaults, "must be a table: [defaults]", source)
    _unknown(defaults, DEFAULT_KEYS, "defaults.", source)
    defaults = _checked(defaults, "defaults.", source)
    hosts = doc.get("hosts")
    if not isinstance(hosts, list) or not hosts or not all(isinstance(h, dict) for h in hosts):
        raise ConfigError("hosts", hosts, "must list at least one host as [[hosts]] tables, each with an address",
                          source, hint='[[hosts]]\naddress = "100.101.1.5"')
    parsed = []
    for index, table in enumerate(hosts):
        where = f"hosts[{index}]."
        _unknown(table, HOST_KEYS, where, source)
        own = _checked(table, where, source)
        # A host's own python or venv replaces either one from [defaults]; env tables add up.
        interpreter = {"python", "venv"}
        merged = {k: v for k, v in defaults.items() if not (k in interpreter and interpreter & own.keys())}
        merged.update(own)
        merged["env"] = {**defaults.get("env", {}), **own.get("env", {})}
        parsed.append(_host(merged, index, path.parent, where, source))
    _check_unique(parsed, source)
    return Inventory(path=path, name=name, master_port=master_port, hosts=tuple(parsed))


def _check_unique(hosts: list[Host], source: str) -> None:
    seen_names: dict[str, int] = {}
    seen_targets: dict[tuple[str, int], int] = {}
    for index, host in enumerate(hosts):
        if host.name in seen_names:
            raise ConfigError(f"hosts[{index}].name", host.name, f"is also hosts[{seen_names[host.name]}]'s name", source)
        target = (host.address, host.port)
        if target in seen_targets:
            raise ConfigError(f"hosts[{index}].address", host.address, f"port {host.port} is also "
                              f"hosts[{seen_targets[target]}]: each machine is one host", source,
                              hint="for more processes on one machine, raise its nproc_per_node")
        seen_names[host.name] = seen_targets[target] = index


def load_inventory(path: Path, given: bool = True) -> Inventory:
    """Read and parse the inventory; the identity files it names must exist. A file the user named
    (`given`) that is not there is bad input (exit 2); the lab's own, not written yet, is the lab's
    state (exit 1: no `labctl up --ssh`)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        kind = LabError if given else StateError
        raise kind(f"no inventory at {path}", hint="write one (see `labctl hosts --help`), or `labctl up --ssh` "
                   "writes .lab/<lab>/hosts.toml for the lab's nodes") from None
    except (OSError, UnicodeError) as exc:  # a folder, no permission, a name too long, not text, no file name
        raise LabError(f"cannot read the inventory {str(path)!r}: {exc.strerror if isinstance(exc, OSError) else exc}",
                       hint="--inventory takes the path of a TOML file") from None
    inventory = parse_inventory(text, path)
    for index, host in enumerate(inventory.hosts):
        if host.identity_file is not None and not host.identity_file.is_file():
            raise ConfigError(f"hosts[{index}].identity_file", str(host.identity_file), "no such file", str(path),
                              hint="relative paths are relative to the inventory's folder")
    return inventory


# ------------------------------------------------------------------------------------ rendering


def _toml_value(key: str, value: Any) -> str:
    """`key = value` on one line. A table (env) stays inline: tomli-w would start a [key] section,
    which would end [defaults] or [[hosts]]. Its keys are environment names, always bare keys."""
    if isinstance(value, dict):
        return f"{key} = {{ {', '.join(_toml_value(k, v) for k, v in value.items())} }}"
    return tomli_w.dumps({key: value}).strip()


def render_inventory(*, name: str, master_port: int, defaults: dict[str, Any], hosts: list[dict[str, Any]],
                     comment: str) -> str:
    """The TOML text of an inventory, with a comment on top; values formatted by tomli-w."""
    lines = [f"# {line}" if line else "#" for line in comment.splitlines()]
    lines += [_toml_value("name", name), _toml_value("master_port", master_port), "", "[defaults]"]
    lines += [_toml_value(key, value) for key, value in defaults.items()]
    for host in hosts:
        lines += ["", "[[hosts]]"] + [_toml_value(key, value) for key, value in host.items()]
    return "\n".join(lines) + "\n"
