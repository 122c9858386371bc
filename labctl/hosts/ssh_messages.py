"""Reading what OpenSSH says back: host-key fingerprints as `ssh-keygen -l` prints them, and ssh's
own failure messages (a changed key, an unknown one, a refused login, no route) turned into one
line and a fix. Pure: text in, values out.
"""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass

from labctl.errors import StateError
from labctl.hosts.inventory import Host


def key_fingerprint(key_type: str, blob_b64: str) -> str:
    """OpenSSH's SHA256 fingerprint of a public key, as `ssh-keygen -l` prints it."""
    digest = hashlib.sha256(base64.b64decode(blob_b64)).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def scanned_fingerprints(keyscan_output: str) -> list[tuple[str, str]]:
    """(key type, fingerprint) for each `host type base64` line of ssh-keyscan."""
    out = []
    for line in keyscan_output.splitlines():
        fields = line.split()
        if len(fields) >= 3 and not line.startswith("#"):
            try:
                out.append((fields[1], key_fingerprint(fields[1], fields[2])))
            except ValueError:
                continue
    return out


_CHANGED = re.compile(r"REMOTE HOST IDENTIFICATION HAS CHANGED")
_SENT = re.compile(r"The fingerprint for the (\S+) key sent by the remote host is\s+(SHA256:[A-Za-z0-9+/]+)")
_OFFENDING = re.compile(r"Offending \S+ key in (.+?):(\d+)")
_UNKNOWN = re.compile(r"No \S+ host key is known for|Host key verification failed")
_AUTH = re.compile(r"Permission denied \(([^)]*)\)")
_UNREACHABLE = re.compile(r"(Connection refused|Connection timed out|No route to host|Could not resolve hostname"
                          r"[^\n]*|Network is unreachable|Operation timed out|Connection closed by[^\n]*|"
                          r"Connection reset by[^\n]*|kex_exchange_identification[^\n]*)")


class SSHError(StateError):
    """SSH could not run anything on a host: which host, what ssh said, what to do. Exit status 1:
    the host's state (unreachable, a refused key), not the command typed."""

    def __init__(self, host: Host, message: str, hint: str | None = None, kind: str = "ssh"):
        super().__init__(message, hint)
        self.host = host
        self.kind = kind


@dataclass(frozen=True)
class Failure:
    kind: str  # changed | unknown | auth | unreachable
    detail: str = ""
    key_type: str = ""
    fingerprint: str = ""
    where: str = ""  # known_hosts file:line of the key on record


def classify(stderr: str) -> Failure | None:
    """What went wrong, from ssh's own words (exit status 255), or None when ssh said nothing we know."""
    if _CHANGED.search(stderr):
        sent = _SENT.search(stderr)
        offending = _OFFENDING.search(stderr)
        return Failure("changed", key_type=sent.group(1) if sent else "", fingerprint=sent.group(2) if sent else "?",
                       where=f"{offending.group(1)}:{offending.group(2)}" if offending else "")
    if _UNKNOWN.search(stderr):
        return Failure("unknown")
    auth = _AUTH.search(stderr)
    if auth:
        return Failure("auth", detail=auth.group(0))
    unreachable = _UNREACHABLE.search(stderr)
    if unreachable:
        return Failure("unreachable", detail=unreachable.group(0).strip())
    return None


def explain(host: Host, name: str, failure: Failure, presented: list[tuple[str, str]]) -> SSHError:
    """The refusal or failure as one message and a hint. `presented`: what ssh-keyscan saw the host offer."""
    known = str(host.known_hosts or "~/.ssh/known_hosts")
    who = f"{name} ({host.destination})"
    pattern = host.known_hosts_name
    if failure.kind == "changed":
        return SSHError(host, f"{who}: REFUSED, its host key has CHANGED: it now presents {failure.key_type} key "
                        f"{failure.fingerprint}, which is not the key on record in {failure.where or known}. Someone may "
                        "be intercepting the connection, or the machine was reinstalled; labctl never replaces a "
                        "known key by itself",
                        hint=f"if you know it was reinstalled, compare {failure.fingerprint} with `ssh-keygen -lf "
                        f"/etc/ssh/ssh_host_{failure.key_type.lower()}_key.pub` run on that machine, then remove "
                        f"the old key with `ssh-keygen -R '{pattern}' -f {known}` and run again with --accept-new",
                        kind="hostkey-changed")
    if failure.kind == "unknown":
        offered = ", ".join(f"{t} {fp}" for t, fp in presented) or "nothing ssh-keyscan could read"
        return SSHError(host, f"{who}: its host key is not in {known}, and labctl does not trust a key it has never "
                        f"seen. The host presents {offered}",
                        hint="compare that with `ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` run on the host "
                        "itself; if it matches, run again with --accept-new, which records it", kind="hostkey-unknown")
    if failure.kind == "auth":
        return SSHError(host, f"{who}: SSH refused the login ({failure.detail})",
                        hint="check user and identity_file in the inventory; the public key must be in "
                        "~/.ssh/authorized_keys of that user on the host", kind="auth")
    return SSHError(host, f"{who}: cannot reach it over SSH ({failure.detail})",
                    hint=f"is the machine up, sshd running and TCP {host.port} open to you? `{host.ssh_command}` "
                    "by hand says the same", kind="unreachable")
