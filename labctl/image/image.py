"""Build the node image, also where no container registry answers.

1. Base: the configured BASE_IMAGE if it is local or can be pulled; otherwise a local Debian base
   (debootstrap from the apt mirror this machine already uses, then `docker import`), built once
   (labctl/image/base.py).
2. Wheelhouse: the host's pip downloads torch (CPU build) and its dependencies into
   .lab/wheelhouse of the build context for the base image's own Python and platform, which a short
   run of the base image reports (labctl/image/wheelhouse.py), and the Dockerfile installs from there
   with --no-index.
3. Build with the Docker SDK, showing the Dockerfile's steps as a progress bar (labctl/image/builder.py,
   which after `build --lean` also removes the build's intermediate stages), in two parts that the
   Dockerfile's `FROM runtime` line divides:
   - the runtime: the base, torch and its packages installed from the wheels (the `runtime` stage,
     tagged ddplab-runtime:HASH, HASH made of that part of the Dockerfile, the wheels' names and
     the build arguments), built only where no image has that tag;
   - the node's own files (the entry points, the trainer): the rest of the Dockerfile, built FROM
     that runtime image with a context of those files alone. A change to the trainer is seconds,
     with no wheel needed, even after `build --lean` removed the stage that installed torch.
   The node image carries a hash of all its inputs as a label, so an up-to-date image is recognised
   without building.

The build context is the checkout, or for an installed labctl a folder in its cache laid out the
same way (labctl/core/assets.py), so the hash is the same for both.

The CUDA image (Dockerfile.cuda, `build --cuda`) is made the same way from a build context of its
own per torch release, whose wheelhouse holds torch's CUDA build and its nvidia-* packages (GBs the
CPU build must not send to the engine). The version-mismatch scenario's second image is that image
at another release.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import re
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from labctl.core import assets
from labctl.core.ui import Report
from labctl.errors import CommandError, LabError
from labctl.image.base import TARGET_CACHE, ensure_base, find_image, image_exists, node_target
from labctl.image.builder import BuildSource, NullProgress, docker_build, remove_replaced, remove_stages
from labctl.image.wheelhouse import (
    Target,
    fill_wheelhouse,
    forget_wheelhouse,
    missing_wheels,
    prune_wheelhouse,
    resolve_wheelhouse,
    stamped_wheels,
)
from labctl.spec.labspec import LabSpec, cuda_tag
from labctl.spec.units import format_bytes

LABEL_BUILD_HASH = "io.ddplab.build-hash"
LABEL_RUNTIME_HASH = "io.ddplab.runtime-hash"
RUNTIME_STAGE = "runtime"  # the Dockerfile's stage with torch installed: `FROM runtime` begins the node's own files
RUNTIME_REPOSITORY = "ddplab-runtime"



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
    runtime_digest: str = ""  # runtime_hash: of what the runtime stage is made of

    @property
    def wheelhouse(self) -> Path:
        return assets.wheelhouse(self.context)

    @property
    def runtime_tag(self) -> str:
        return f"{RUNTIME_REPOSITORY}:{self.runtime_digest}"


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
    return content_hash(((str(p.relative_to(root)), p.read_bytes()) for p in sorted(files)), wheel_names, build_args)


def runtime_hash(dockerfile: str, text: str, wheel_names: Iterable[str], build_args: dict[str, str]) -> str:
    """Content hash of what the runtime stage is made from: the Dockerfile's text before `FROM runtime`
    (split_dockerfile), the wheels and the build arguments; not the node's own files."""
    return content_hash([(dockerfile, split_dockerfile(text, dockerfile)[0].encode())], wheel_names, build_args)


def content_hash(parts: Iterable[tuple[str, bytes]], wheel_names: Iterable[str], build_args: dict[str, str]) -> str:
    digest = hashlib.sha256()
    for name, data in parts:
        digest.update(name.encode())
        digest.update(data)
    for name in sorted(wheel_names):
        digest.update(name.encode())
    for key in sorted(build_args):
        digest.update(f"{key}={build_args[key]}".encode())
    return digest.hexdigest()[:16]


def image_inputs(root: Path, dockerfile: str = "Dockerfile") -> list[Path]:
    """The files of build context `root` that the Dockerfile copies into the image (and itself)."""
    return [root / dockerfile, *node_files(root)]


def node_files(root: Path) -> list[Path]:
    """The node's own files, which the Dockerfile copies after `FROM runtime`: what .dockerignore lets
    through of compose/ and trainer/."""
    files = [root / "compose" / "node-entrypoint.sh", root / "compose" / "slurm-node.sh"]
    files += sorted(p for p in (root / "trainer").rglob("*") if p.is_file() and "__pycache__" not in p.parts
                    and p.suffix != ".pyc")
    return files


def split_dockerfile(text: str, name: str = "Dockerfile") -> tuple[str, str]:
    """(the runtime stages, the node's own files' steps): the Dockerfile's text cut at its one
    `FROM runtime` line, which the second part replaces with FROM the runtime image."""
    lines = text.splitlines(keepends=True)
    cuts = [i for i, line in enumerate(lines) if line.split() == ["FROM", RUNTIME_STAGE]]
    if len(cuts) != 1:
        raise LabError(f"{name} has {len(cuts)} lines `FROM {RUNTIME_STAGE}`; labctl builds it in two parts cut at one",
                       hint=f"keep the stage that installs torch named `{RUNTIME_STAGE}` and the node's files after "
                            f"one `FROM {RUNTIME_STAGE}`, as this project's Dockerfile does")
    return "".join(lines[:cuts[0]]), "".join(lines[cuts[0] + 1:])


def node_files_context(root: Path, dockerfile: str, runtime_tag: str,
                       build_args: dict[str, str]) -> tuple[bytes, dict[str, str]]:
    """The build of the node's own files: a tar of node_files and a Dockerfile that is the given
    one's steps after `FROM runtime`, FROM the runtime image; and the build arguments those steps
    declare (ARG NAME: the engine warns of any other)."""
    top = split_dockerfile((root / dockerfile).read_text(), dockerfile)[1]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in node_files(root):
            tar.add(path, arcname=str(path.relative_to(root)), recursive=False)
        text = f"FROM {runtime_tag}\n{top}".encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size, info.mode = len(text), 0o644
        tar.addfile(info, io.BytesIO(text))
    declared = set(re.findall(r"^ARG\s+(\w+)", top, re.M))
    return buffer.getvalue(), {k: v for k, v in build_args.items() if k in declared}


# ------------------------------------------------------------------------------ side effects


def ensure_wheelhouse(config: LabSpec, target: Target, report: Report, wheelhouse: Path) -> list[str]:
    """torch (CPU build), numpy and their dependencies for the node's Python; returns the file names."""
    names = fill_wheelhouse(wheelhouse, wheel_requirements(config.torch_version), target, report,
                            cpu_index_url=config.torch_index_url)
    cuda = cuda_wheels(names)
    if cuda:
        raise LabError(f"the wheelhouse got CUDA packages ({', '.join(cuda[:3])}, ...): the torch wheel is not a CPU build",
                       hint="set DDPLAB_TORCH_INDEX_URL to https://download.pytorch.org/whl/cpu")
    return names


def ensure_cuda_wheelhouse(config: LabSpec, target: Target, report: Report, wheelhouse: Path,
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


def image_tag(config: LabSpec, cuda: bool = False) -> str:
    return cuda_tag(config.torch_version) if cuda else config.image_tag


def gather_inputs(client, config: LabSpec, report: Report, cuda: bool = False,
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
    runtime = runtime_hash(dockerfile, (context / dockerfile).read_text(), wheels, build_args)
    return BuildInputs(context, dockerfile, base, build_args, digest, tuple(wheels), runtime)


def image_hash(client, tag: str) -> str | None:
    """The input hash an existing image was built with; None when there is no such image."""
    return built_hash(find_image(client, tag))


def built_hash(image) -> str | None:
    """The input hash of a docker Image (find_image), or None for no image or one without it."""
    return (image.labels or {}).get(LABEL_BUILD_HASH) if image is not None else None


def build_missing(client, config: LabSpec, images: set[str], report: Report, progress_factory=None) -> None:
    """Build those of a lab's node images (the CPU image, the CUDA image) that are missing (`up`)."""
    for tag, cuda in ((config.image_tag, False), (config.cuda_image_tag, True)):
        if tag in images and not image_exists(client, tag):
            report(f"image {tag} is missing: building it" + (" (as `labctl build --cuda` does; GBs, once)" if cuda else ""))
            build_image(client, config, report, progress_factory, cuda=cuda)


def build_image(client, config: LabSpec, report: Report, progress_factory=None, force: bool = False,
                cuda: bool = False, lean: bool = False) -> BuildResult:
    """Build the node image (config.image_tag; with `cuda`, config.cuda_image_tag from Dockerfile.cuda)
    unless an image with the same input hash exists: its runtime where no image has the runtime's
    tag (or with `force`), then the node's own files on it, and the image the tag named before goes
    (remove_replaced). With `lean`, remove what the images do not need afterwards: the runtime
    build's intermediate stages (labctl/image/builder.py) and, built or not, the wheel files (their
    names stay: prune_wheelhouse)."""
    started = time.monotonic()
    tag = image_tag(config, cuda)
    inputs = gather_inputs(client, config, report, cuda=cuda)
    existing = find_image(client, tag)
    cached = not force and built_hash(existing) == inputs.digest
    if not cached:
        progress = progress_factory or NullProgress
        if force or not image_exists(client, inputs.runtime_tag):
            inputs = build_runtime(client, config, inputs, report, progress(), cuda=cuda, lean=lean)
        else:
            report(f"image: torch and its packages are built ({inputs.runtime_tag}); building the node's files on it")
        context, args = node_files_context(inputs.context, inputs.dockerfile, inputs.runtime_tag, inputs.build_args)
        built = docker_build(client, tag, BuildSource("Dockerfile", args, fileobj=context),
                             labels={LABEL_BUILD_HASH: inputs.digest}, progress=progress())[-1]
        remove_replaced(client, existing.id if existing else None, built, tag, report)
    if lean and (freed := prune_wheelhouse(inputs.wheelhouse)):
        report(f"lean: removed the wheelhouse's wheels ({format_bytes(freed)}; their names, which the image's hash is "
               "made of, stay, and a build fetches them again)")
    return BuildResult(tag, inputs.base, cached, time.monotonic() - started)


def build_runtime(client, config: LabSpec, inputs: BuildInputs, report: Report, progress, cuda: bool,
                  lean: bool) -> BuildInputs:
    """The Dockerfile's stages up to `runtime`, tagged inputs.runtime_tag, from the wheels (fetched
    where a `build --lean` removed them, or only their names were resolved); returns the inputs then."""
    if missing_wheels(inputs.wheelhouse, inputs.wheels):
        report("wheelhouse: fetching the wheels (resolved by name only, or removed by a `build --lean`)")
        forget_wheelhouse(inputs.wheelhouse)
        inputs = gather_inputs(client, config, report, cuda=cuda, fetch=True)
    source = BuildSource(inputs.dockerfile, inputs.build_args, context=str(inputs.context), target=RUNTIME_STAGE)
    stages = docker_build(client, inputs.runtime_tag, source, labels={LABEL_RUNTIME_HASH: inputs.runtime_digest},
                          progress=progress)
    if lean:
        remove_stages(client, stages, report)
    return inputs


def build_images(client, config: LabSpec, report: Report, progress_factory=None, *, force: bool = False,
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


def ensure_mismatch_image(client, config: LabSpec, report: Report, version: str = MISMATCH_VERSION,
                          progress_factory=None) -> str:
    """The node image with a different torch release, for one node of the version-mismatch scenario:
    the CUDA image (Dockerfile.cuda) at `version`, built once and kept (`labctl down` never removes
    images). A CUDA build because that is what pip's index offers for another release; on CPU it
    trains with gloo like any node."""
    return build_image(client, dataclasses.replace(config, torch_version=version), report, progress_factory,
                       cuda=True).tag
