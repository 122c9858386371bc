"""`labctl doctor`'s reachability probe: `python -c TEXT CONFIG_JSON` on every node at once
(labctl.diagnose.doctor.probe_reach).

CONFIG_JSON: {"listen": [PORT, ...], "targets": [[NAME, IP, PORT], ...], "connect_s": S,
"window_s": S, "expect": N}. The probe listens on each port of "listen" (SO_REUSEADDR, on
0.0.0.0) and accepts for up to window_s seconds; meanwhile it connects to every target, trying
each again for up to connect_s (peers may still be starting to listen). Prints one line of JSON:
{"bind_errors": {PORT: WHY}, "results": [[NAME, IP, PORT, STATUS, MS], ...]}, where STATUS is
"ok", "timeout", "refused" or the OS's message, and MS how long the target took.
"""

import json
import socket
import sys
import threading
import time


def listen(ports):
    """(listening sockets, {port: why} for those that could not be bound)."""
    errors, listeners = {}, []
    for port in ports:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
            s.listen(64)
            s.settimeout(0.1)
            listeners.append(s)
        except OSError as e:
            errors[str(port)] = e.strerror or str(e)
    return listeners, errors


def connect(ip, port, connect_s):
    """(status, milliseconds): the first "ok", or the last failure once connect_s has passed."""
    t0 = time.monotonic()
    while True:
        try:
            with socket.create_connection((ip, port), timeout=0.5):
                status = "ok"
                break
        except socket.timeout:
            status = "timeout"
        except ConnectionRefusedError:
            status = "refused"
        except OSError as e:
            status = e.strerror or str(e)
        if time.monotonic() - t0 > connect_s:
            break
        time.sleep(0.1)
    return status, round((time.monotonic() - t0) * 1000)


def probe(cfg):
    deadline = time.monotonic() + cfg["window_s"]
    listeners, errors = listen(cfg["listen"])
    accepted, lock = [0], threading.Lock()

    def serve(s):
        while time.monotonic() < deadline:
            try:
                s.accept()[0].close()
                with lock:
                    accepted[0] += 1
            except OSError:
                pass

    for s in listeners:
        threading.Thread(target=serve, args=(s,), daemon=True).start()
    results = []

    def one(target, ip, port):
        results.append([target, ip, port, *connect(ip, port, cfg["connect_s"])])

    threads = [threading.Thread(target=one, args=t) for t in cfg["targets"]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Keep listening for peers still on their way, until every one expected has connected: a pair that
    # cannot connect (a firewall) keeps the window open to its end, a healthy lab ends as soon as it can.
    while time.monotonic() < deadline and accepted[0] < cfg["expect"]:
        time.sleep(0.05)
    return {"bind_errors": errors, "results": results}


if __name__ == "__main__":
    print(json.dumps(probe(json.loads(sys.argv[1]))))
