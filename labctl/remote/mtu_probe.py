"""`labctl doctor`'s path-MTU probe over a lab's tunnel: `python -c TEXT CONFIG_JSON` on every node
at once (labctl.diagnose.tunnel.probe_mtu).

CONFIG_JSON: {"name": NODE, "iface": IFACE, "port": PORT, "targets": [[NAME, IP], ...],
"sizes": [BYTES, ...], "send_at": [S, ...], "window_s": S}. The sizes tried are those of "sizes"
below IFACE's MTU, and the MTU itself. The probe listens on UDP PORT and, at each time of "send_at"
(seconds after it started: the peers' probes start a little apart, and a packet sent before a peer
listens is lost), sends every target each size in "sizes" (the whole IP packet: 28 bytes of IPv4
and UDP headers, the rest payload), with the don't-fragment bit set, as TCP sends its segments.
Through a tunnel nothing is fragmented: a packet that the path under the tunnel cannot carry
vanishes, and where the path's ICMP "fragmentation needed" is dropped too, nobody learns why. It
listens until window_s has passed and prints one line of JSON: {"mtu": IFACE'S MTU, "sent": [SIZE,
...] (those that left), "send_errors": {SIZE: WHY}, "received": {SENDER: [SIZE, ...]}}.
"""

import json
import socket
import sys
import time

HEADERS = 28  # IPv4 (20) and UDP (8)
IP_MTU_DISCOVER = getattr(socket, "IP_MTU_DISCOVER", 10)  # Linux's values, where Python does not name them
IP_PMTUDISC_DO = getattr(socket, "IP_PMTUDISC_DO", 2)


def mtu_of(iface):
    with open("/sys/class/net/%s/mtu" % iface) as f:
        return int(f.read())


def send_round(sock, cfg, sizes, sent, errors):
    """Every size to every target once; `sent` gains the sizes that left, `errors` why others did not."""
    for size in sizes:
        tag = ("%s %d " % (cfg["name"], size)).encode()
        payload = tag + b"." * max(0, size - HEADERS - len(tag))
        for _target, ip in cfg["targets"]:
            try:
                sock.sendto(payload, (ip, cfg["port"]))
                sent.add(size)
            except OSError as e:
                errors[str(size)] = e.strerror or str(e)


def probe(cfg):
    start = time.monotonic()
    mtu = mtu_of(cfg["iface"])
    sizes = [s for s in cfg["sizes"] if s < mtu] + [mtu]
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
    sock.bind(("0.0.0.0", cfg["port"]))
    sock.settimeout(0.02)
    sent, errors, received, rounds = set(), {}, {}, sorted(cfg["send_at"])
    while time.monotonic() - start < cfg["window_s"]:
        if rounds and time.monotonic() - start >= rounds[0]:
            rounds.pop(0)
            send_round(sock, cfg, sizes, sent, errors)
        try:
            data = sock.recv(65535)
        except socket.timeout:
            continue
        fields = data[:80].split(b" ")
        if len(fields) >= 2 and fields[1].isdigit():
            received.setdefault(fields[0].decode(errors="replace"), set()).add(int(fields[1]))
    sock.close()
    return {"mtu": mtu, "sent": sorted(sent), "send_errors": errors,
            "received": {sender: sorted(sizes) for sender, sizes in received.items()}}


if __name__ == "__main__":
    print(json.dumps(probe(json.loads(sys.argv[1]))))
