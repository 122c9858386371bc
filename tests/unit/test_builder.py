"""labctl/image/builder.py on a real classic build: the CPU node image's stream and `docker history`
of its three stages' images (base, packages, the image), recorded from Docker 20.10 with
tests/unit/builds/ (a cached build, so every step says "Using cache")."""

from __future__ import annotations

import json
from pathlib import Path

from labctl.image.builder import stage_images, unique_bytes, unused_stages

BUILDS = Path(__file__).parent / "builds"
CHUNKS = [json.loads(line) for line in (BUILDS / "cpu-image.jsonl").read_text().splitlines()]
HISTORY = json.loads((BUILDS / "cpu-image-history.json").read_text())
BASE, PACKAGES, IMAGE = (f"sha256:{i}" for i in (
    "95a61881f0c4aa042acebe68bd72cbde769a1e76df5c97a3c3e9a4f94bee7fab",
    "19bbbe7174debd2bc0cbb273515677f1e351579e69c5903396ae8ea64131c38f",
    "80683bb3db47a23231d7258c3191fcf7839b3a1da88c771bdd8df95fc9ce7760"))


def ids(history: list[dict]) -> list[str]:
    return [layer["Id"] for layer in history]


def test_each_stage_reports_the_image_it_ended_with_the_built_image_last():
    assert stage_images(CHUNKS) == [BASE, PACKAGES, IMAGE]
    assert any("Successfully built 80683bb3db47" in c.get("stream", "") for c in CHUNKS)


def test_only_the_stage_the_image_does_not_stand_on_is_unused():
    assert BASE in ids(HISTORY[IMAGE]) and PACKAGES not in ids(HISTORY[IMAGE])
    assert unused_stages([BASE, PACKAGES, IMAGE], ids(HISTORY[IMAGE])) == [PACKAGES]


def test_a_single_stage_build_has_nothing_to_remove():
    assert unused_stages([IMAGE], ids(HISTORY[IMAGE])) == []
    assert unused_stages([], []) == []


def test_removing_the_packages_stage_frees_its_venv_and_wheels_not_the_shared_base():
    venv, wheelhouse = 950_079_049, 219_163_051  # pip's install and `COPY .lab/wheelhouse`, as history lists them
    assert unique_bytes(HISTORY[PACKAGES], ids(HISTORY[IMAGE])) == venv + wheelhouse
    assert unique_bytes(HISTORY[BASE], ids(HISTORY[IMAGE])) == 0


def test_messages_that_are_not_a_stage_image_are_ignored():
    assert stage_images([{"stream": "Step 1/2 : FROM x"}, {"aux": {"Tag": "v"}}, {"aux": "text"},
                         {"aux": {"ID": "sha256:ab"}}]) == ["sha256:ab"]
