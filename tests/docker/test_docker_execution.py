"""Code execution on the Docker backend: a real engine, the image's python3 (bookworm's
jupyter_client 7.4 and ipykernel 6.17), the runner over ``docker exec -i``.

One python kernel and its runner serve the whole module; the requests go straight to the
backend's execution hub, as the daemon hands them over.
"""

from __future__ import annotations

import base64
import time
import uuid

import pytest
import pytest_asyncio
from docker.errors import ImageNotFound
from test_docker_backend import _cleanup, cluster_spec

from agent import protocol
from agent.backends.docker import DockerBackend
from agent.config import AgentConfig
from tests.agent.agent_helpers import (
    ANSI,
    FLOOD_50MB,
    PNG_1PX,
    Frames,
    Runs,
    peak_rss,
    peak_rss_reset,
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
    frames = Frames()
    b = DockerBackend(config, frames, client=docker_client)
    b.set_agent_id("agent-exec-test")
    b.frames = frames
    await b.start()
    try:
        yield b
    finally:
        await b.destroy_kernels(list(b.kernels), "test over")
        await b.close()
        _cleanup(docker_client, config.agent_key)


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


async def test_state_persists_from_one_run_to_the_next(runs):
    first, _ = await runs.run("x = 41")  # the first one starts the runner
    answer, records = await runs.run("x + 1")
    assert (first["exit_code"], answer["exit_code"]) == (0, 0)
    assert records == [{"kind": "result", "data": "42", "mime": "text/plain"}]


async def test_a_run_waiting_for_input_gets_the_line_and_goes_on(runs):
    answer, records = await runs.run("print('hi', input('Name: '))")
    assert (answer["status"], text(records)) == ("waiting-input", "Name: ")
    answer, records = await runs.run("Ada", mode="input", run_id=answer["run_id"])
    assert (answer["status"], answer["exit_code"], text(records)) == ("finished", 0, "hi Ada\n")


async def test_a_ten_second_run_is_streamed_to_its_end(runs):
    code = "import time\nfor i in range(10):\n    print(i, flush=True)\n    time.sleep(1)\n"
    started = time.monotonic()
    answer = await runs.ask("query", code, stream=True, timeout=30)
    pieces = [
        f["records"]
        for f in runs.frames.seen
        if f.get("type") == protocol.EXEC_RECORDS and f["run_id"] == answer["run_id"]
    ]
    assert time.monotonic() - started >= 9
    assert len(pieces) >= 5  # sent as they came, not once at the end
    assert text(answer["records"]) == "".join(f"{i}\n" for i in range(10))
    assert (answer["status"], answer["exit_code"]) == ("finished", 0)


async def test_an_endless_loop_is_interrupted(runs):
    answer = await runs.ask("query", "while True: pass", flush=0.5)
    assert answer["status"] == "continued"
    answer, records = await runs.run("", mode="interrupt", run_id=answer["run_id"])
    assert (answer["status"], answer["exit_code"]) == ("finished", 1)
    assert "KeyboardInterrupt" in ANSI.sub("", text(records, "error"))


async def test_a_png_display_comes_back_as_image_png(runs):
    code = f"from IPython.display import Image, display\ndisplay(Image(data={PNG_1PX!r}))\n"
    _, records = await runs.run(code)
    displays = [r for r in records if r["kind"] == "display"]
    assert [r["mime"] for r in displays] == ["image/png"]
    assert base64.b64decode(displays[0]["data"]) == PNG_1PX


async def test_completing_import_o_offers_os(runs):
    answer = await runs.ask("complete", "import o", options={"cursor_pos": 8})
    assert "os" in answer["completions"]


async def test_a_50_mb_burst_is_cut_at_the_limit_and_the_agent_stays_small(runs):
    peak_rss_reset()
    before = peak_rss()
    answer = await runs.ask("query", FLOOD_50MB, stream=True, timeout=120)
    assert (answer["status"], answer["exit_code"]) == ("finished", 0)
    assert len(text(answer["records"])) == LIMIT
    assert answer["records"][-1]["data"] == (
        "[output cut: more than 1 MiB; the rest of this run's output was dropped]"
    )
    assert peak_rss() - before < 32 * 1024**2


async def test_a_batch_builds_then_runs_and_answers_the_exit_status(runs):
    options = {"build": "printf 'print(6 * 7)' > prog.py", "exec": "python3 prog.py; exit 7"}
    answer, records = await runs.run("", mode="batch", options=options)
    assert (answer["status"], answer["exit_code"], text(records)) == ("finished", 7, "42\n")


async def test_sys_exit_3_gives_exit_code_3(runs):
    answer, _ = await runs.run("raise SystemExit(3)")
    assert (answer["status"], answer["exit_code"]) == ("finished", 3)


async def test_the_runner_runs_as_the_kernel_user_in_its_home(runs):
    _, records = await runs.run("import os\nprint(os.getuid(), os.getcwd())")
    assert text(records) == "1000 /home/work\n"


async def test_an_image_without_python_answers_no_code_runner(backend):
    runs = await start_kernel(backend, MINIMAL_IMAGE)
    answer = await runs.ask("query", "print(1)")
    assert (answer["status"], answer["exit_code"]) == ("finished", 127)
    assert answer["records"] == [
        {
            "kind": "stderr",
            "data": "this image has no code runner (it needs python3 with ipykernel)",
            "mime": None,
        }
    ]
