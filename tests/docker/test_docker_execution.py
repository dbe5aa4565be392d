"""Code execution on the Docker backend: a real engine, the image's python3 (bookworm's
jupyter_client 7.4 and ipykernel 6.17), the runner over ``docker exec -i``.

One python kernel and its runner serve the whole module; the requests go straight to the
backend's execution hub, as the daemon hands them over.
"""

from __future__ import annotations

import uuid

import pytest
import pytest_asyncio
from docker.errors import ImageNotFound
from test_docker_backend import cluster_spec, running_backend

from agent import protocol
from agent.backends.docker import DockerBackend
from agent.config import AgentConfig
from tests.agent.agent_helpers import (
    CodeExecutionOnEveryBackend,
    Runs,
    assert_no_code_runner,
    text,
)
from tests.conftest import skip_or_fail

pytestmark = [pytest.mark.docker, pytest.mark.asyncio(loop_scope="module")]

PYTHON_IMAGE = "bai-kernel/python:2"
MINIMAL_IMAGE = "bai-kernel/minimal:1"
LIMIT = 1024 * 1024


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def backend(docker_client, tmp_path_factory):
    for image in (PYTHON_IMAGE, MINIMAL_IMAGE):
        try:
            docker_client.images.get(image)
        except ImageNotFound:
            skip_or_fail(f"kernel image {image} is missing (python manage.py build_kernel_images)")
    config = AgentConfig(
        token=f"exec-test-{uuid.uuid4().hex}",
        work_dir=tmp_path_factory.mktemp("exec") / "work",
        exec_output_limit=LIMIT,
    )
    async with running_backend(docker_client, config) as b:
        try:
            yield b
        finally:  # its kernels are alone in their sessions: no network to remove
            await b.destroy_kernels(list(b.kernels), "test over")


async def start_kernel(backend: DockerBackend, image: str) -> Runs:
    spec = cluster_spec(image, hosts=("main1",))
    spec["kernels"][0]["slots"]["mem"] = str(512 * 1024**2)
    kernel_id = spec["session_id"]
    await backend.create_kernels(spec)
    await backend.frames.wait_for(
        type=protocol.KERNEL_STATUS, kernel_id=kernel_id, status="running"
    )
    return Runs(backend.frames, backend.execution.handle, kernel_id)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def runs(backend):
    return await start_kernel(backend, PYTHON_IMAGE)


class TestCodeExecution(CodeExecutionOnEveryBackend):
    limit = LIMIT
    stream = True


async def test_the_runner_runs_as_the_kernel_user_in_its_home(runs):
    _, records = await runs.run("import os\nprint(os.getuid(), os.getcwd())")
    assert text(records) == "1000 /home/work\n"


async def test_an_image_without_python_answers_no_code_runner(backend):
    runs = await start_kernel(backend, MINIMAL_IMAGE)
    assert_no_code_runner(await runs.ask("query", "print(1)"))
