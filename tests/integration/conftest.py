"""Integration tests: a real Docker engine, real containers, real torch.distributed.

A missing engine fails these tests (it never skips them): `make test` starts one first.
Every lab has a unique name, but not every test has a lab of its own. A test gets one of:
- `lab3` or `lab2`: the plain 3- or 2-node lab of its pytest process (an xdist worker, or the
  `alone` run), shared by every module of that process that asks for one (SharedLabs). The
  fixture is the module's: the module's tests use the lab one after another, each finding what the
  ones before left; before each later module the lab is reset and checked (and replaced if the
  reset cannot bring it back), and it is removed only when the session ends. `lab3` is (name,
  `up --json`'s status), `lab2` the name. A module's `lab` that returns one of them (test_links,
  test_link_groups, test_latency_shaping) is that shared lab under another name.
- `lab_name`: a name for a lab of the test's own, which the test brings up as it needs
  (`labctl up ...`); removed, volumes too, when the test ends.
- a module's own fixture, for a lab that a module changes for good or sets up differently (Slurm,
  SSH hosts, faults, packages, the traced straggler, and test_node_commands' `lab2`, a lab of its
  own under the shared fixture's name, since its last test takes it down): brought up for the
  module's first test that asks for it, removed, volumes too, after the module's last (a few are
  per test instead: test_hosts' `own_ssh_lab`, for a test that changes a node).
A few tests bring up a lab of their own inline (new_lab_name, then drop_lab in a `finally`).
A module's tests all run in one process, in order: `make test` hands its workers a module at a
time (`--dist loadfile`). So a module's fixtures are set up once, a module may count on its tests'
order, and a shared lab serves one module at a time and never crosses processes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from labctl.net.apply import helper_name
from labctl.run.launch import FORK_SOCKET, LINKS_FOLDER

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"
LABEL = "io.ddplab.lab"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"  # the first 8 bytes of every PNG file: a picture was drawn
# Per test, its fixtures' share included (pytest-timeout): above the longest timeout a test gives a
# command of its own (600 s: an image build, `docker load`, pip), so that one fails first and says
# which command hung; a test that hangs anywhere else fails here, with its stack, and its lab's
# finalizer still runs.
INTEGRATION_TIMEOUT_S = 900


# The longest modules (their tests' time in the part run three at a time, measured on 2026-12-07,
# longest first; tests/docs' page tests are test_docs.py's), handed out first: `make test` spreads
# the integration tests over its workers a module at a time (pytest-xdist --dist loadfile
# --no-loadscope-reorder: xdist would otherwise deal the modules with the most tests first), and a
# long module dealt last would run on alone while the other workers idle. Only the order changes.
LONG_FIRST = ("test_slurm_cluster.py", "test_scenarios.py", "test_pytest_plugin.py", "test_docs.py",
              "test_scenarios_mesh.py", "test_hosts.py", "test_faults.py", "test_compile.py", "test_ci_workflow.py",
              "test_training.py", "test_lab.py", "test_overlay.py", "test_packages.py", "test_latency_shaping.py",
              "test_warm.py", "test_packages_lightning.py", "test_packaging.py", "test_lab_api.py", "test_kubernetes.py",
              "test_other_python.py", "test_known_limits.py", "test_failed_runs.py", "test_netem_kernel.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(Path(str(item.fspath)).name, len(LONG_FIRST)))  # stable
    for item in items:
        if Path(str(item.fspath)).is_relative_to(Path(__file__).parent):
            item.add_marker(pytest.mark.integration)
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(INTEGRATION_TIMEOUT_S))


@pytest.fixture(scope="session")
def docker_client():
    import docker

    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure here means no engine
        pytest.fail(f"integration tests need a running Docker engine ({exc}); `make test` starts one", pytrace=False)
    return client


def required_image(docker_client, tag: str, what: str, build: str) -> str:
    """`tag`, which `make test` builds before the suite: a failure, never a skip, where it is missing."""
    try:
        docker_client.images.get(tag)
    except Exception:  # noqa: BLE001
        pytest.fail(f"{what} {tag} is missing; `make test` builds it (or `{build}`)", pytrace=False)
    return tag


@pytest.fixture(scope="session")
def node_image(docker_client):
    from labctl.spec.labspec import resolve_config

    return required_image(docker_client, resolve_config(environ=os.environ).image_tag, "node image", "labctl build")


@pytest.fixture(scope="session")
def cuda_image(docker_client):
    """The CUDA node image at the lab's release (Dockerfile.cuda): `make test` builds it on every
    machine, GPU or not, so that the image is exercised on every run."""
    from labctl.spec.labspec import resolve_config

    return required_image(docker_client, resolve_config(environ=os.environ).cuda_image_tag, "CUDA node image",
                          "labctl build --cuda")


def copy_workspace(root: Path) -> Path:
    """The workspace's files into `root`, as a fresh clone has them (tracked and new, nothing ignored)."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, files):
        if (REPO / name).is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, root / name)
    return root


# The labs of one test (the lab_name fixture's): they run a job or two, so `up` starts their fork
# servers with idle imports off (`up --idle-imports off`, labctl.run.warm): torch._dynamo would be
# imported once idle, 1.4 to 2.4 CPU-seconds a node, for runs that never come.
ONE_TEST_LABS: set[str] = set()
# `up` options for a lab on which nothing runs through the fork servers (it is only brought up,
# grown, inspected, or its runs go over SSH): with the lab's own `--warm off`, no node imports torch
# for runs that never come (about 1.3 CPU-seconds a node; `up` takes the setting afresh each time).
NO_RUNS = ("--warm", "off")


def labctl(*args: str, timeout: float = 300, check: bool | None = None, env: dict | None = None,
           cwd: Path = REPO) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess, as a user would."""
    lab = args[args.index("--lab") + 1] if "--lab" in args[:-1] else None
    lean = {"DDPLAB_IDLE_IMPORTS": "off"} if lab in ONE_TEST_LABS else {}
    result = subprocess.run([sys.executable, "-m", "labctl", *args], cwd=cwd, capture_output=True, text=True,
                            timeout=timeout, env={**os.environ, "COLUMNS": "200", **lean, **(env or {})})
    if check is True:
        assert result.returncode == 0, f"labctl {' '.join(args)} -> {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


def interruptible() -> None:
    """preexec_fn for a labctl the test will Ctrl-C: SIGINT back to its default. A suite started in
    the background by a non-interactive shell (`make test &`) runs with SIGINT ignored, children
    inherit that, and Python then installs no KeyboardInterrupt handler: the SIGINT would never
    arrive."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def summary_of(output: str) -> dict:
    """The one SUMMARY line a trainer run prints, parsed."""
    lines = [line for line in output.splitlines() if "SUMMARY {" in line]
    assert len(lines) == 1, f"expected one SUMMARY line, got {len(lines)}:\n{output}"
    return json.loads(lines[0].split("SUMMARY ", 1)[1])


def neighbours(client, lab: str, node: str) -> dict[str, tuple[str, str]]:
    """A node's neighbour table as its kernel has it: IP to (MAC, state)."""
    output = client.containers.get(f"{lab}-{node}").exec_run(["ip", "neigh", "show", "dev", "eth0"]).output.decode()
    return {f[0]: (f[2], f[-1]) for f in (line.split() for line in output.splitlines()) if len(f) >= 4}


def permanent_peers(client, lab: str, nodes: list[dict]) -> dict[str, bool]:
    """Whether each node holds a permanent entry with the right MAC for every peer and nothing else
    (labctl.net.neighbors); `nodes` as `status --json` lists them. The bridge's own address, the
    host's side of the network, is no peer: a node that has answered the host (a run's first, rank 0)
    has learnt it by ARP, as it should."""
    settings = client.containers.get(f"{lab}-{nodes[0]['name']}").attrs["NetworkSettings"]["Networks"]
    gateway = settings[f"{lab}-net"]["Gateway"]  # the engine's choice, the subnet's first address
    macs = {n["ip"]: client.containers.get(f"{lab}-{n['name']}").exec_run(["cat", "/sys/class/net/eth0/address"])
            .output.decode().strip() for n in nodes}
    return {n["name"]: {ip: entry for ip, entry in neighbours(client, lab, n["name"]).items() if ip != gateway}
            == {ip: (mac, "PERMANENT") for ip, mac in macs.items() if ip != n["ip"]} for n in nodes}


PS = ["ps", "-eo", "pid=,ppid=,args="]
FORK_SERVER = f" serve {FORK_SOCKET} "  # in a fork server's command line, and its forked workers'


def still_running(ps_output: str, pattern: str) -> list[str]:
    """The processes of `ps -eo pid=,ppid=,args=` whose command line matches `pattern` (a regex, as
    pgrep -f takes it), less the node's fork server, which lives as long as the lab: its command
    line holds its own source, torchrun and all. A worker it forked has the same command line and is
    counted: its parent is the server."""
    rows = [line.split(None, 2) for line in ps_output.splitlines() if len(line.split(None, 2)) == 3]
    forked = {pid for pid, _, args in rows if FORK_SERVER in args}
    return [f"{pid} {args[:80]}" for pid, ppid, args in rows
            if re.search(pattern, args) and not (pid in forked and ppid not in forked)]


def lab_resources(client, lab: str) -> dict[str, list[str]]:
    """Names of everything labelled with the lab. Raw list calls: the SDK's containers.list()
    inspects each container and fails on one removed in between."""
    selector = {"label": f"{LABEL}={lab}"}
    return {
        "containers": sorted(c["Names"][0].lstrip("/") for c in client.api.containers(all=True, filters=selector)),
        "networks": sorted(n.name for n in client.networks.list(filters=selector)),
        "volumes": sorted(v.name for v in client.volumes.list(filters=selector)),
    }


def wait_for(done, timeout_s: float = 20, interval_s: float = 1.0) -> bool:
    """Asks done() every interval_s until it holds or timeout_s has passed: whether it held at last
    (the caller asserts on that, or on the state itself for a message that shows it)."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)
    return True


def new_lab_name() -> str:
    """it-<random>; DDPLAB_IT_LAB_PREFIX replaces "it" where several suites share one engine."""
    return f"{os.environ.get('DDPLAB_IT_LAB_PREFIX', 'it')}-{uuid.uuid4().hex[:8]}"


def module_lab(nodes: int):
    """A lab of `nodes` nodes for the tests of one module, removed after them."""
    name = new_lab_name()
    labctl("up", "--lab", name, "--nodes", str(nodes), check=True)
    yield name
    drop_lab(name)


def drop_lab(name: str) -> None:
    """Remove the lab and its workspace folder (env files, run logs): a test leaves nothing behind."""
    labctl("down", "--lab", name, "--volumes")
    shutil.rmtree(REPO / ".lab" / name, ignore_errors=True)


@pytest.fixture
def lab_name(docker_client, node_image):
    """A unique lab name, torn down (volumes too) whatever the test did: a lab of one test, whose
    fork servers `labctl()` starts with idle imports off (ONE_TEST_LABS)."""
    name = new_lab_name()
    ONE_TEST_LABS.add(name)
    yield name
    drop_lab(name)
    ONE_TEST_LABS.discard(name)


class SharedLabs:
    """The plain labs of one pytest process (an xdist worker, or the `alone` run), one per node
    count, shared by the modules that ask for one: brought up when the first module does, reset and
    checked before each later one, removed when the session ends. kind's e2e suite keeps one cluster
    a job and sigs.k8s.io/e2e-framework one a package, for the same reason: a bring-up is the
    dearest thing a lab test does (Compose, a fork server importing torch in every node, the
    teardown).

    A module sees such a lab as a fresh one would be: every node running with its CPU limit, links
    unshaped, no process but the node's own and its fork server, no helper container (a pending
    `shape --duration` undo), and `status` reading what `up` reported. The reset makes it so and
    checks it; a lab the reset cannot bring back is removed and a new one brought up."""

    def __init__(self, client):
        self.client = client
        self.labs: dict[int, tuple[str, dict, dict]] = {}  # nodes -> (name, up's status, CPU limit by node)
        self.bring_ups = self.served = self.resets = 0
        self.replaced: list[str] = []  # why a lab the reset could not bring back was replaced

    def lab(self, nodes: int) -> tuple[str, dict]:
        self.served += 1
        if nodes in self.labs:
            name, status, cpus = self.labs[nodes]
            self.resets += 1
            wrong = self.reset(name, status, cpus)
            if wrong is None:
                return name, status
            self.replaced.append(f"{name}: {wrong}")
            print(f"shared lab {name}: {wrong}; a new one is brought up", file=sys.stderr)
            drop_lab(name)
        name = new_lab_name()
        self.bring_ups += 1
        status = json.loads(labctl("up", "--lab", name, "--nodes", str(nodes), "--json", check=True).stdout)
        self.labs[nodes] = (name, status, self.cpu_limits(name, status))
        return name, status

    def cpu_limits(self, lab: str, status: dict) -> dict[str, float | None]:
        from labctl.engine.docker import node_cpus_limit

        return {n["name"]: node_cpus_limit(self.client, lab, n["name"]) for n in status["nodes"]}

    def reset(self, lab: str, status: dict, cpus: dict[str, float | None]) -> str | None:
        """Clear what a module may have left (a paused or stopped node, a fork server gone,
        processes, CPU limits, links and their kept calibrations), then check that the lab is as `up` left it: what is still
        wrong, or None."""
        from labctl.engine.docker import apply_node_cpus

        for node in status["nodes"]:
            container = self.client.containers.get(f"{lab}-{node['name']}")
            if container.status == "paused":
                container.unpause()
        if not self.running(lab, status) or not all(self.survey(self.client.containers.get(f"{lab}-{n['name']}"))[1]
                                                    for n in status["nodes"]):
            labctl("up", "--lab", lab, check=True)  # `up` starts a stopped node and a missing fork server
        for node in status["nodes"]:
            container = self.client.containers.get(f"{lab}-{node['name']}")
            strays, _ = self.survey(container)
            if strays:
                container.exec_run(["kill", "-9", *strays])
        for node, limit in self.cpu_limits(lab, status).items():
            if limit != cpus[node]:
                apply_node_cpus(self.client, lab, node, cpus[node])
        labctl("shape", "--lab", lab, "--clear")
        # the link calibrations the module's runs kept (trainer/linkstate.py): a fresh lab has none,
        # and its status says so (links_calibrated)
        shutil.rmtree(REPO / ".lab" / lab / LINKS_FOLDER, ignore_errors=True)
        return self.wrong(lab, status, cpus)

    def wrong(self, lab: str, status: dict, cpus: dict[str, float | None]) -> str | None:
        again = json.loads(labctl("status", "--lab", lab, "--json", check=True).stdout)
        links = [n.pop("link") for n in again["nodes"]]
        if links != ["unshaped"] * len(links):
            return f"links still shaped after --clear: {links}"
        if again != status:
            return f"status {again} is not what up reported: {status}"
        limits = self.cpu_limits(lab, status)
        if limits != cpus:
            return f"CPU limits {limits}, not {cpus}"
        # each node's kept network helper stays with it (labctl.net.apply); anything else is a leftover
        kept = {f"{lab}-{n['name']}" for n in status["nodes"]} | {helper_name(lab, n["name"]) for n in status["nodes"]}
        helpers = set(lab_resources(self.client, lab)["containers"]) - kept
        if helpers:
            return f"helper containers still there: {sorted(helpers)}"
        for node in status["nodes"]:
            strays, served = self.survey(self.client.containers.get(f"{lab}-{node['name']}"))
            if strays:
                return f"{node['name']} still runs {strays}"
            if not served:
                return f"{node['name']} has no fork server"
        return None

    def running(self, lab: str, status: dict) -> bool:
        states = {c["Names"][0].lstrip("/"): c["State"] for c in
                  self.client.api.containers(all=True, filters={"label": f"{LABEL}={lab}"})}
        return all(states.get(f"{lab}-{n['name']}") == "running" for n in status["nodes"])

    @staticmethod
    def survey(container) -> tuple[list[str], bool]:
        """(the pids of a node's processes other than its own and its fork server, whether it has a
        fork server). Its own: docker-init and its entry point's sleep. The strays are a run's
        leftovers or anything a test started there; a worker the server forked shares its command
        line, and its parent is the server."""
        rows = [tuple(line.split(None, 2)) for line in container.exec_run(PS).output.decode().splitlines()]
        rows = [row for row in rows if len(row) == 3 and row[2] != " ".join(PS)]  # not the ps itself
        marked = {pid for pid, _, args in rows if FORK_SERVER in args}
        servers = {pid for pid, ppid, _ in rows if pid in marked and ppid not in marked}
        own = {pid for pid, ppid, args in rows if pid == "1" or (ppid == "1" and args == "sleep infinity")}
        return [pid for pid, _, _ in rows if pid not in own | servers], bool(servers)

    def close(self) -> None:
        for name, _, _ in self.labs.values():
            drop_lab(name)


    def line(self) -> str:
        replaced = f"; replaced {len(self.replaced)}: {'; '.join(self.replaced)}" if self.replaced else ""
        return (f"shared labs: {self.bring_ups} brought up for {self.served} modules, "
                f"{self.resets - len(self.replaced)} of {self.resets} resets checked clean{replaced}")


SHARED_LINES: list[str] = []  # this process's SharedLabs line, for the terminal summary (xdist: the controller's)


@pytest.fixture(scope="session")
def shared_labs(request, docker_client, node_image):
    labs = SharedLabs(docker_client)
    yield labs
    labs.close()
    if hasattr(request.config, "workeroutput"):  # an xdist worker: tests/conftest.py prints it on the controller
        request.config.workeroutput.setdefault("summary_lines", []).append(labs.line())
    else:
        SHARED_LINES.append(labs.line())


def pytest_terminal_summary(terminalreporter):
    for line in SHARED_LINES:
        terminalreporter.write_line(line)


@pytest.fixture(scope="module")
def lab3(shared_labs):
    """A plain 3-node lab for the tests of one module, as `up` leaves it: this process's shared one,
    reset and checked (SharedLabs). A module that changes a lab for good (faults, `down`) takes its
    own."""
    return shared_labs.lab(3)


@pytest.fixture(scope="module")
def lab2(shared_labs):
    """A plain 2-node lab, shared as lab3 is."""
    return shared_labs.lab(2)[0]


def run_scenario(name: str, docker_client, *options: str) -> dict:
    """`labctl scenario run NAME OPTIONS...`, checked, and nothing of its lab left: its outcome
    (tests/integration/test_scenarios.py and test_scenarios_mesh.py)."""
    from labctl.api.scenarios import SCENARIOS, scenario_lab

    lab = scenario_lab(name, options[options.index("--overlay") + 1] if "--overlay" in options else None)
    kept = REPO / ".lab" / lab
    try:
        result = labctl("scenario", "run", name, *options, "--json", timeout=SCENARIOS[name].bound_s + 60)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        [outcome] = json.loads(result.stdout)
        check_outcome(name, outcome, kept)
    finally:
        shutil.rmtree(kept, ignore_errors=True)
    assert lab_resources(docker_client, lab) == {"containers": [], "networks": [], "volumes": []}
    return outcome


def check_outcome(name: str, outcome: dict, kept: Path) -> None:
    from labctl.api.scenarios import SCENARIOS

    assert outcome["ok"] and outcome["fixed_ok"]
    # version-mismatch's honest symptom may be none at all: torch never checks
    assert outcome["symptom"] or not SCENARIOS[name].symptom_required, "the broken run showed no symptom"
    assert outcome["doctor"], "doctor found nothing wrong with the broken configuration"
    assert outcome["doctor_seconds"] < 5
    assert outcome["total_seconds"] <= SCENARIOS[name].bound_s
    if SCENARIOS[name].timeline:  # the straggler: node1 at a fraction of a CPU in the broken run
        assert outcome["timeline"].startswith("the others waited for rank 1 (node1): "), outcome["timeline"]
        png = Path(outcome["timeline"].rsplit("timeline: ", 1)[1])
        assert png.read_bytes()[:8] == PNG_MAGIC and png.is_relative_to(kept / "runs")
    else:
        assert not kept.exists()


PIPELINE_SCRIPT = str(REPO / "examples" / "pipeline" / "my_pipeline_script.py")
PIPELINE_LINE = re.compile(r"PIPELINE rank=(\d+) stages=(\d+) schedule=(\S+) micro_batches=(\d+) steps=(\d+) "
                           r"layers=(\d+)-(\d+) params_match=(\w+)(?: loss=(\S+) first_loss=(\S+))?")


def run_pipeline(lab: str, stages: int, *options: str) -> dict[int, tuple]:
    """examples/pipeline/my_pipeline_script.py through `labctl run` on `lab`, one stage a node: each
    rank's line, checked (every stage's parameters those of the same layers trained in one process,
    the layers split in order, the last stage's loss falling). {rank: (first layer, last layer)}."""
    out = labctl("run", "--lab", lab, "--", PIPELINE_SCRIPT, *options, check=True).stdout
    lines = {int(m[0]): m for m in PIPELINE_LINE.findall(out)}
    assert sorted(lines) == list(range(stages)) and all(m[1] == str(stages) for m in lines.values()), out[-2000:]
    assert all(m[7] == "True" for m in lines.values()), out[-2000:]
    layers = {rank: (int(m[5]), int(m[6])) for rank, m in lines.items()}
    assert [layers[r][0] for r in range(stages)] == [0] + [layers[r][1] + 1 for r in range(stages - 1)], layers
    last = lines[stages - 1]
    assert float(last[8]) < float(last[9]), last  # its loss, after the steps, below the first step's
    return layers
