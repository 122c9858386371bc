"""Build the node image, also where no container registry answers.

1. Base: the configured BASE_IMAGE if it is local or can be pulled; otherwise a local Debian base
   (debootstrap from the apt mirror this machine already uses, then `docker import`), built once.
2. Wheelhouse: the host's pip downloads torch (CPU build) and its dependencies into
   .lab/wheelhouse of the build context for the base image's own Python and platform, which a short
   run of the base image reports (labctl/lab/wheelhouse.py), and the Dockerfile installs from there
   with --no-index.
3. Build with the Docker SDK, showing the Dockerfile's steps as a progress bar (labctl/lab/builder.py,
   which after `build --lean` also removes the build's intermediate stages). The image carries a
   hash of its inputs as a label, so an up-to-date image is recognised without building.

The build context is the checkout, or for an installed labctl a folder in its cache laid out the
same way (labctl/assets.py), so the hash is the same for both.

The CUDA image (Dockerfile.cuda, `build --cuda`) is made the same way from a build context of its
own per torch release, whose wheelhouse holds torch's CUDA build and its nvidia-* packages (GBs the
CPU build must not send to the engine). The version-mismatch scenario's second image is that image
at another release.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

from labctl import assets
from labctl.config import LabConfig, cuda_tag
from labctl.errors import CommandError, LabError
from labctl.lab.builder import NullProgress, docker_build, remove_stages
from labctl.lab.wheelhouse import (
    Target,
    fill_wheelhouse,
    forget_wheelhouse,
    missing_wheels,
    prune_wheelhouse,
    resolve_wheelhouse,
    stamped_wheels,
    target_from_probe,
)
from labctl.proc import run
from labctl.units import format_bytes

LABEL_BUILD_HASH = "io.ddplab.build-hash"
TARGET_CACHE = "node-python.json"  # in the cache folder: the base image's Python, by base image id
TARGET_PROBE = Path(__file__).resolve().parents[1] / "remote" / "python_target.py"
BASE_PACKAGES = ("python3,python3-venv,python3-pip,iproute2,iperf3,procps,util-linux,ca-certificates,"
                 "openssh-server,rsync,libnss-wrapper,slurmd,slurmctld,slurm-client,munge")
# The local base's tag names its package list, so a base made before the list changed is not reused.
LOCAL_BASE = f"ddplab-base:bookworm-{hashlib.sha256(BASE_PACKAGES.encode()).hexdigest()[:8]}"

Report = Callable[[str], None]


@dataclass(frozen=True)
class BuildResult:
    tag: str
    base: str
    cached: bool
    seconds: float = 0.0


@dataclass(frozen=True)
class BuildInputs:
    """What an image is built from, gathered but not built: `build --print-hash` shows it."""

    context: Path  # the folder `docker build` runs in
    dockerfile: str  # "Dockerfile" or "Dockerfile.cuda", in context
    base: str
    build_args: dict[str, str]
    digest: str  # build_hash of it all: the image's LABEL_BUILD_HASH
    wheels: tuple[str, ...] = ()  # the wheelhouse's file names

    @property
    def wheelhouse(self) -> Path:
        return assets.wheelhouse(self.context)


# --------------------------------------------------------------------------------------- pure


def wheel_requirements(torch_version: str, cuda: bool = False) -> list[str]:
    """What the node's venv is made of. For the CUDA image, a CPU build of the same release (a
    local version label `+cpu`, as the CPU index and pip's local copies name it) is ruled out: PEP 440
    sorts 2.13.0+cpu above 2.13.0, so pip would otherwise take it wherever it can see both."""
    torch = f"torch=={torch_version},!={torch_version}+cpu" if cuda else f"torch=={torch_version}"
    return [torch, "numpy"]


def cuda_wheels(names: Iterable[str]) -> list[str]:
    """The CUDA runtime's wheels among a wheelhouse's files (nvidia_*: wheel file names use underscores):
    what a CPU build must not have and a CUDA build must."""
    return [n for n in names if n.startswith("nvidia_")]


def dockerfile_name(cuda: bool) -> str:
    return "Dockerfile.cuda" if cuda else "Dockerfile"


def build_hash(files: Iterable[Path], wheel_names: Iterable[str], build_args: dict[str, str], root: Path) -> str:
    """Content hash of everything the image is made from: files (named relative to the build
    context `root`, so a checkout and an installed package's copy hash alike), wheels, build arguments."""
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    for name in sorted(wheel_names):
        digest.update(name.encode())
    for key in sorted(build_args):
        digest.update(f"{key}={build_args[key]}".encode())
    return digest.hexdigest()[:16]


def image_inputs(root: Path, dockerfile: str = "Dockerfile") -> list[Path]:
    """The files of build context `root` that the Dockerfile copies into the image (and itself)."""
    files = [root / dockerfile, root / "compose" / "node-entrypoint.sh", root / "compose" / "slurm-node.sh"]
    files += [p for p in (root / "trainer").rglob("*.py") if "__pycache__" not in p.parts]
    return files


def debian_mirror_from_apt(sources_dir: Path = Path("/etc/apt")) -> str:
    """The Debian mirror apt uses here: the route to packages that is known to work on this machine."""
    candidates: list[Path] = [sources_dir / "sources.list"]
    candidates += sorted((sources_dir / "sources.list.d").glob("*")) if (sources_dir / "sources.list.d").is_dir() else []
    for path in candidates:
        try:
            text = path.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            line = line.strip()
            uris = []
            if line.startswith("URIs:"):
                uris = line.split()[1:]
            elif line.startswith("deb ") and "bookworm" in line:
                uris = [w for w in line.split() if "://" in w]
            for uri in uris:
                if uri.rstrip("/").endswith("/debian"):
                    return uri
    return "http://deb.debian.org/debian"


# ------------------------------------------------------------------------------ side effects


def ensure_wheelhouse(config: LabConfig, target: Target, report: Report, wheelhouse: Path) -> list[str]:
    """torch (CPU build), numpy and their dependencies for the node's Python; returns the file names."""
    names = fill_wheelhouse(wheelhouse, wheel_requirements(config.torch_version), target, report,
                            cpu_index_url=config.torch_index_url)
    cuda = cuda_wheels(names)
    if cuda:
        raise LabError(f"the wheelhouse got CUDA packages ({', '.join(cuda[:3])}, ...): the torch wheel is not a CPU build",
                       hint="set DDPLAB_TORCH_INDEX_URL to https://download.pytorch.org/whl/cpu")
    return names


def ensure_cuda_wheelhouse(config: LabConfig, target: Target, report: Report, wheelhouse: Path,
                           fetch: bool = True) -> list[str]:
    """torch's CUDA build, numpy and their dependencies (the CUDA runtime, cuDNN and NCCL as nvidia-*
    wheels) through pip's own index: PyPI's torch for Linux is the CUDA build. For another CUDA
    release, point pip at PyTorch's index for it (PIP_INDEX_URL=https://download.pytorch.org/whl/cu126).
    Without `fetch`, only their names (resolve_wheelhouse): GBs that an image found up to date never needs."""
    requirements = wheel_requirements(config.torch_version, cuda=True)
    names = resolve_cuda_wheels(wheelhouse, requirements, target, report) if not fetch else []
    if not names:
        if not stamped_wheels(wheelhouse, requirements, target):
            report(f"wheelhouse: torch {config.torch_version} CUDA build and its nvidia-* packages "
                   "(GBs; once per release)")
        try:
            names = fill_wheelhouse(wheelhouse, requirements, target, report)
        except CommandError as exc:
            raise LabError(f"could not download torch=={config.torch_version} (CUDA build) for "
                           f"{target.describe()}: {exc}",
                           hint="point pip at an index that has it (PIP_INDEX_URL, e.g. "
                                "https://download.pytorch.org/whl/cu126)") from None
    if not cuda_wheels(names):
        raise LabError(f"the wheelhouse for the CUDA image got no nvidia-* packages ({', '.join(names[:4])}, ...): "
                       "that torch wheel is not a CUDA build",
                       hint="point pip at an index with CUDA builds (PyPI, or https://download.pytorch.org/whl/cu126)")
    return names


def resolve_cuda_wheels(wheelhouse: Path, requirements: list[str], target: Target, report: Report) -> list[str]:
    """The wheels' names without their GBs, or [] where pip cannot tell them so (a pip before 22.2
    has no `install --dry-run --report`): then they are fetched, as before."""
    try:
        return resolve_wheelhouse(wheelhouse, requirements, target, report)
    except CommandError as exc:
        why = (exc.stderr or exc.stdout).strip().splitlines()[-1:] or [f"status {exc.returncode}"]
        report(f"wheelhouse: pip could not resolve the wheels by name ({why[0][:200]}); fetching them")
        forget_wheelhouse(wheelhouse)
        return []


def node_target(client, image: str, report: Report, cache: Path) -> Target:
    """The interpreter and platform of an image's python3, asked of the image itself (half a
    second, once per image: answers are kept by image id)."""
    image_id = client.images.get(image).id
    try:
        known = json.loads(cache.read_text())
    except (OSError, ValueError):
        known = {}
    if isinstance(known.get(image_id), dict):
        try:
            return Target(**known[image_id])
        except TypeError:
            pass
    report(f"image: asking {image} which Python it has")
    output = client.containers.run(image, ["python3", "-c", TARGET_PROBE.read_text()], entrypoint=[], remove=True,
                                   network_disabled=True, user="0:0").decode(errors="replace")
    try:
        target = target_from_probe(json.loads(output.strip().splitlines()[-1]))
    except (ValueError, IndexError, KeyError):
        raise LabError(f"{image} did not say which Python it has: {output[:300]!r}",
                       hint="the base image needs python3 on its PATH (DDPLAB_BASE_IMAGE)") from None
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({**known, image_id: dataclasses.asdict(target)}, indent=1) + "\n")
    return target


def image_exists(client, tag: str) -> bool:
    import docker.errors

    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def ensure_base(client, config: LabConfig, report: Report) -> str:
    """The base image to build FROM: the configured one if we have or can pull it, else a local one."""
    import docker.errors

    if image_exists(client, config.base_image):
        return config.base_image
    report(f"base: pulling {config.base_image}")
    try:
        client.images.pull(config.base_image)
        return config.base_image
    except docker.errors.APIError as exc:
        reason = str(exc.explanation or exc).splitlines()[0][:160]
        report(f"base: cannot pull {config.base_image} ({reason}); using a local Debian base instead")
    if not image_exists(client, LOCAL_BASE):
        build_local_base(config, report)
    return LOCAL_BASE


def build_local_base(config: LabConfig, report: Report) -> None:
    """debootstrap a minimal bookworm with Python 3.11 and import it as an image (about a minute)."""
    if os.geteuid() != 0:
        raise LabError(f"cannot pull {config.base_image} and building a local base needs root (debootstrap)",
                       hint="make the base image available (docker pull or docker load), or run as root")
    if shutil.which("debootstrap") is None:
        report("base: installing debootstrap")
        run(["apt-get", "install", "-y", "-qq", "debootstrap"], check=False)
        if shutil.which("debootstrap") is None:
            run(["apt-get", "update", "-qq"])
            run(["apt-get", "install", "-y", "-qq", "debootstrap"])
    mirror = config.debian_mirror or debian_mirror_from_apt()
    report(f"base: debootstrap bookworm from {mirror} (about a minute, once)")
    with tempfile.TemporaryDirectory(prefix="ddplab-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        run(["debootstrap", "--variant=minbase", f"--include={BASE_PACKAGES}", "bookworm", str(rootfs), mirror])
        # openssh-server's install made host keys: no image layer may carry them (nodes make their own).
        for key in (rootfs / "etc" / "ssh").glob("ssh_host_*"):
            key.unlink()
        report(f"base: importing as {LOCAL_BASE}")
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        try:
            run_import = subprocess.run(["docker", "import", "-c", "ENV LANG=C.UTF-8", "-", LOCAL_BASE],
                                        stdin=tar.stdout, capture_output=True, text=True)
        finally:
            tar.stdout.close()
            tar.wait()
        if run_import.returncode != 0:
            raise CommandError(["docker", "import", "-", LOCAL_BASE], run_import.returncode, run_import.stdout, run_import.stderr)


def image_tag(config: LabConfig, cuda: bool = False) -> str:
    return cuda_tag(config.torch_version) if cuda else config.image_tag


def gather_inputs(client, config: LabConfig, report: Report, cuda: bool = False,
                  fetch: bool = False) -> BuildInputs:
    """The base image, the wheelhouse and the build context made ready, and their hash; builds nothing.
    The CUDA image's wheels are only resolved, by name, unless `fetch`."""
    if cuda:
        context = assets.prepare_build_context(assets.cuda_build_context(config.cache_dir, config.torch_version))
    else:
        context = assets.prepare_build_context(assets.build_context(config.cache_dir))
    base = ensure_base(client, config, report)
    target = node_target(client, base, report, assets.cache_dir(config.cache_dir) / TARGET_CACHE)
    if cuda:  # its GBs of wheels are fetched only for a build: build_image
        wheels = ensure_cuda_wheelhouse(config, target, report, assets.wheelhouse(context), fetch=fetch)
    else:
        wheels = ensure_wheelhouse(config, target, report, assets.wheelhouse(context))
    build_args = {"BASE_IMAGE": base, "TORCH_VERSION": config.torch_version}
    dockerfile = dockerfile_name(cuda)
    digest = build_hash(image_inputs(context, dockerfile), wheels, build_args, context)
    return BuildInputs(context, dockerfile, base, build_args, digest, tuple(wheels))


def image_hash(client, tag: str) -> str | None:
    """The input hash an existing image was built with; None when there is no such image."""
    if not image_exists(client, tag):
        return None
    return (client.images.get(tag).labels or {}).get(LABEL_BUILD_HASH)


def build_missing(client, config: LabConfig, images: set[str], report: Report, progress_factory=None) -> None:
    """Build those of a lab's node images (the CPU image, the CUDA image) that are missing (`up`)."""
    for tag, cuda in ((config.image_tag, False), (config.cuda_image_tag, True)):
        if tag in images and not image_exists(client, tag):
            report(f"image {tag} is missing: building it" + (" (as `labctl build --cuda` does; GBs, once)" if cuda else ""))
            build_image(client, config, report, progress_factory, cuda=cuda)


def build_image(client, config: LabConfig, report: Report, progress_factory=None, force: bool = False,
                cuda: bool = False, lean: bool = False) -> BuildResult:
    """Build the node image (config.image_tag; with `cuda`, config.cuda_image_tag from Dockerfile.cuda)
    unless an image with the same input hash exists. With `lean`, remove what the image does not
    need afterwards: the build's intermediate stages (labctl/lab/builder.py) and, built or not, the
    wheel files (their names stay: prune_wheelhouse)."""
    started = time.monotonic()
    tag = image_tag(config, cuda)
    inputs = gather_inputs(client, config, report, cuda=cuda)
    cached = not force and image_hash(client, tag) == inputs.digest
    if not cached:
        if missing_wheels(inputs.wheelhouse, inputs.wheels):
            report("wheelhouse: fetching the wheels (resolved by name only, or removed by a `build --lean`)")
            forget_wheelhouse(inputs.wheelhouse)
            inputs = gather_inputs(client, config, report, cuda=cuda, fetch=True)
        stages = docker_build(client, tag, context=str(inputs.context), dockerfile=inputs.dockerfile,
                              build_args=inputs.build_args, labels={LABEL_BUILD_HASH: inputs.digest},
                              progress=progress_factory() if progress_factory else NullProgress())
        if lean:
            remove_stages(client, stages, report)
    if lean and (freed := prune_wheelhouse(inputs.wheelhouse)):
        report(f"lean: removed the wheelhouse's wheels ({format_bytes(freed)}; their names, which the image's hash is "
               "made of, stay, and a build fetches them again)")
    return BuildResult(tag, inputs.base, cached, time.monotonic() - started)


def build_images(client, config: LabConfig, report: Report, progress_factory=None, *, force: bool = False,
                 cuda: bool = False, mismatch: bool = False, lean: bool = False) -> Iterator[tuple[str, BuildResult]]:
    """`labctl build`: the node image (CPU, or with `cuda` the CUDA one), then with `mismatch` the
    version-mismatch scenario's image; yields (what it is, result) as each is done."""
    kind = "CUDA build" if cuda else "CPU build"
    yield f"torch {config.torch_version}, {kind}", build_image(client, config, report, progress_factory, force, cuda,
                                                                 lean)
    if mismatch:
        result = build_image(client, dataclasses.replace(config, torch_version=MISMATCH_VERSION), report,
                             progress_factory, force, cuda=True, lean=lean)
        yield f"torch {MISMATCH_VERSION}, CUDA build, for the version-mismatch scenario", result


MISMATCH_VERSION = "2.14.1"  # the "other" release for the version-mismatch scenario


def mismatch_tag(config: LabConfig, version: str = MISMATCH_VERSION) -> str:
    return cuda_tag(version)


def ensure_mismatch_image(client, config: LabConfig, report: Report, version: str = MISMATCH_VERSION,
                          progress_factory=None) -> str:
    """The node image with a different torch release, for one node of the version-mismatch scenario:
    the CUDA image (Dockerfile.cuda) at `version`, built once and kept (`labctl down` never removes
    images). A CUDA build because that is what pip's index offers for another release; on CPU it
    trains with gloo like any node."""
    return build_image(client, dataclasses.replace(config, torch_version=version), report, progress_factory,
                       cuda=True).tag
