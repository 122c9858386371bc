"""Docker's classic builder, driven through the SDK: the Dockerfile's steps as a progress bar, and
after a lean build the intermediate stages removed.

Each stage of a multi-stage build leaves its last image behind as build cache, and the node images'
`packages` stage (the wheels, and the venv pip installed from them) is as big as the image again:
about 8 GB more for a CUDA image, 1.2 GB for the CPU one. Only a new runtime (another torch, other
wheels, a change to the Dockerfile before `FROM runtime`) builds that stage again, and the tagged
runtime image, not that cache, is what a change to the trainer is built on (labctl/image/image.py),
so `labctl build --lean` removes those stages once the runtime is built. The
classic builder reports the image each stage ended with (an `aux` ID message), so the removal
touches nothing but what this build made, and never an image the built one stands on.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from labctl.core.ui import Report
from labctl.errors import LabError
from labctl.spec.units import format_bytes

STEP_RE = re.compile(r"^Step (\d+)/(\d+) : (.*)$")



# --------------------------------------------------------------------------------------- pure


def stage_images(chunks: Iterable[Mapping]) -> list[str]:
    """The image each stage of a classic build ended with, in order: the built image last."""
    return [chunk["aux"]["ID"] for chunk in chunks if isinstance(chunk.get("aux"), Mapping) and "ID" in chunk["aux"]]


def unused_stages(stages: list[str], ancestry: Iterable[str]) -> list[str]:
    """Of `stages` (stage_images), those the built image does not stand on: its own layers' images
    (`ancestry`, from `docker history`) are the stages it was built FROM."""
    kept = set(ancestry)  # the built image's history begins with the image itself
    return [image for image in stages[:-1] if image not in kept]


def unique_bytes(history: Iterable[Mapping], kept: Iterable[str]) -> int:
    """What removing an image frees: the sizes of its layers down to the first one `kept` shares."""
    shared = set(kept)
    total = 0
    for layer in history:  # newest first, as `docker history` lists them
        if layer.get("Id") in shared:
            break
        total += int(layer.get("Size") or 0)
    return total


# ------------------------------------------------------------------------------ side effects


@dataclass(frozen=True)
class BuildSource:
    """What a build is made from: the context (a folder, or a tar of one), the Dockerfile in it, its
    build arguments and the stage to stop at."""

    dockerfile: str  # the Dockerfile's path inside the context
    build_args: dict[str, str]  # --build-arg NAME=VALUE
    context: str | None = None  # the context, a folder
    fileobj: bytes | None = None  # or the context as a tar (when no folder is given)
    target: str | None = None  # the stage to stop at; None: the last


def docker_build(client, tag: str, source: BuildSource, *, labels: dict[str, str], progress) -> list[str]:
    """Build `tag` from `source` (up to its target stage), labelled with `labels`, moving `progress`
    step by step; returns stage_images of the build."""
    fileobj = source.fileobj
    stream = client.api.build(path=source.context, fileobj=io.BytesIO(fileobj) if fileobj is not None else None,
                              custom_context=fileobj is not None, dockerfile=source.dockerfile, target=source.target,
                              tag=tag, buildargs=source.build_args, labels=labels, rm=True, forcerm=True, decode=True)
    lines: list[str] = []
    chunks: list[Mapping] = []
    with progress:
        for chunk in stream:
            if "error" in chunk:
                tail = "\n    ".join(lines[-20:])
                raise LabError(f"building {tag} failed: {chunk['error'].strip()}\n    {tail}",
                               hint="see the build output above; `labctl build --verbose` shows every line")
            if "aux" in chunk:
                chunks.append(chunk)
            for line in chunk.get("stream", "").splitlines():
                if not line.strip():
                    continue
                lines.append(line)
                match = STEP_RE.match(line)
                if match:
                    progress.step(int(match.group(1)), int(match.group(2)), match.group(3))
                else:
                    progress.detail(line)
    return stage_images(chunks)


def remove_stages(client, stages: list[str], report: Report) -> int:
    """Remove the stages of a build (stage_images) that its image does not stand on; returns the
    bytes freed. An image some other build has since put to use stays (docker refuses, and says so)."""
    import docker.errors

    if not stages:
        return 0
    ancestry = [layer["Id"] for layer in client.api.history(stages[-1])]
    freed = 0
    for image in unused_stages(stages, ancestry):
        size = unique_bytes(client.api.history(image), ancestry)
        try:
            client.api.remove_image(image)
        except docker.errors.APIError as exc:
            report(f"lean: kept the build's stage {short_id(image)}: {exc.explanation or exc}")
            continue
        freed += size
        report(f"lean: removed the build's intermediate stage {short_id(image)} ({format_bytes(size)} the image does "
               "not use)")
    return freed


def remove_replaced(client, before: str | None, built: str, tag: str, report: Report) -> None:
    """The image `tag` named before a build that gave it `built`: no name is left for it, and after a
    new torch it is GBs. Kept where some other tag still names it, or a container uses it (a lab up
    on it: docker refuses, and the line says so)."""
    import docker.errors

    if before is None or before == built:
        return
    try:
        if client.images.get(before).tags:
            return
        client.api.remove_image(before)
    except docker.errors.ImageNotFound:
        return
    except docker.errors.APIError as exc:
        report(f"image: kept the image {tag} named before ({short_id(before)}): {exc.explanation or exc}")
        return
    report(f"image: removed the image {tag} named before ({short_id(before)}), which nothing names now")


def short_id(image: str) -> str:
    return image.split(":", 1)[-1][:12]


class NullProgress:
    """The progress of a build nobody watches."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def step(self, n: int, total: int, text: str) -> None:
        pass

    def detail(self, line: str) -> None:
        pass
