"""`labctl build --lean` on a real engine: a three-stage build whose middle stage the image does not
stand on. The removal takes that stage, keeps the stage the image is built FROM, and leaves an image
that still has what it copied from the removed one. (`make test` on CI builds the CUDA images so.)"""

from __future__ import annotations

import uuid

import docker.errors
import pytest

from labctl.image.builder import BuildSource, NullProgress, docker_build, remove_stages

pytestmark = pytest.mark.integration

DOCKERFILE = """\
ARG NODE_IMAGE
FROM ${NODE_IMAGE} AS base
RUN echo {token} > /base-marker
FROM base AS stuff
RUN head -c 3000000 /dev/urandom > /blob && sha256sum /blob > /blob.sha256
FROM base
COPY --from=stuff /blob /blob.sha256 /
"""


@pytest.fixture
def tag(docker_client):
    name = f"ddplab-lean-test:{uuid.uuid4().hex[:8]}"
    yield name
    try:
        docker_client.images.remove(name)
    except docker.errors.ImageNotFound:
        pass


def test_a_lean_build_removes_the_stage_the_image_does_not_stand_on(tmp_path, docker_client, node_image, tag):
    # A token of this test's own, so no other build's cache answers the RUN steps.
    (tmp_path / "Dockerfile").write_text(DOCKERFILE.replace("{token}", uuid.uuid4().hex))
    source = BuildSource("Dockerfile", {"NODE_IMAGE": node_image}, context=str(tmp_path))
    stages = docker_build(docker_client, tag, source, labels={}, progress=NullProgress())
    assert len(stages) == 3 and docker_client.images.get(tag).id == stages[-1]
    base, stuff, _ = stages

    messages: list[str] = []
    freed = remove_stages(docker_client, stages, messages.append)
    assert 3_000_000 <= freed < 3_100_000, (freed, messages)
    removed = f"lean: removed the build's intermediate stage {stuff.split(':')[1][:12]}"
    assert messages == [f"{removed} ({freed / 1e6:.1f} MB the image does not use)"]
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.images.get(stuff)
    assert docker_client.images.get(base).id == base, "the stage the image is built FROM must stay"
    out = docker_client.containers.run(tag, ["sh", "-c", "cat /base-marker && sha256sum -c /blob.sha256"], remove=True)
    assert out.decode().splitlines()[-1] == "/blob: OK"
