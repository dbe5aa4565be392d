"""The whole path on a real Docker engine: API → scheduler → gateway → agent
processes → containers, and back. Two agents share one engine, as two nodes
of a multi-node cluster would."""

from __future__ import annotations

import json
import signal
import stat

import pytest

from scheduler_app.reconcile import sweep_lost_agents
from sessions_app.models import Agent, AgentStatus, DataFolder, Kernel, Session, Status
from tests.conftest import skip_or_fail
from tests.live import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.django_db(transaction=True)]

PYTHON_IMAGE = "bai-kernel/python:2"
MINIMAL_IMAGE = "bai-kernel/minimal:1"


@pytest.fixture
def engine(transactional_db):
    try:
        import docker

        client = docker.from_env(timeout=30)
        client.ping()
    except Exception as exc:  # noqa: BLE001
        skip_or_fail(f"no Docker engine answers: {exc}")
    for reference in (PYTHON_IMAGE, MINIMAL_IMAGE):
        try:
            client.images.get(reference)
        except Exception:  # noqa: BLE001
            skip_or_fail(
                f"kernel image {reference} is missing (python manage.py build_kernel_images)"
            )
    yield client
    # Remove only what this test's sessions made (others may share the engine);
    # this runs before the test database is flushed.
    for session_id in Session.objects.values_list("pk", flat=True):
        label = f"ai.backend.session_id={session_id}"
        for container in client.containers.list(all=True, filters={"label": label}):
            container.remove(force=True)
        for network in client.networks.list(names=[f"bai-{session_id}"]):
            try:
                network.remove()
            except Exception:  # noqa: BLE001 - still in use by a container being removed
                pass


def _status(session_id):
    return Session.objects.get(pk=session_id).status


def _wait_status(session_id, wanted, timeout=60):
    wanted = {wanted} if isinstance(wanted, str) else set(wanted)

    def check():
        session = Session.objects.get(pk=session_id)
        return session if session.status in wanted else None

    return wait_for(check, timeout=timeout, what=f"session {session_id} to reach {wanted}")


def _containers(engine, session_id):
    """The session's containers by hostname. The low-level list: the SDK's
    high-level one inspects each container and fails on one being removed."""
    found = engine.api.containers(
        all=True, filters={"label": f"ai.backend.session_id={session_id}"}
    )
    return {c["Labels"]["ai.backend.hostname"]: c["Id"] for c in found}


def _exec(container, cmd: str) -> tuple[int, str]:
    code, out = container.exec_run(["sh", "-c", cmd], user="1000:1000")
    return code, out.decode(errors="replace").strip()


def test_a_multi_node_cluster_of_three_spans_two_agents_and_behaves_as_one(
    engine, images, fast_heartbeats, live_system, make_agent, api, alice
):
    node_a = make_agent("node-a", cpu="2", mem=4 * 2**30)
    node_b = make_agent("node-b", cpu="2", mem=4 * 2**30)
    live_system.start_agent(node_a, "--cpu", "2", "--mem", "4g")
    live_system.start_agent(node_b, "--cpu", "2", "--mem", "4g")
    wait_for(lambda: Agent.objects.filter(status=AgentStatus.ALIVE).count() == 2, what="two agents")
    folder = api(alice).post("/api/v1/folders/", {"name": "shared"}, format="json")
    assert folder.status_code == 201, folder.json()

    response = api(alice).post(
        "/api/v1/sessions/",
        {
            "image": PYTHON_IMAGE,
            "cluster_mode": "multi-node",
            "cluster_size": 3,
            "resources": {"cpu": 1, "mem": "256m"},
            "mounts": ["shared"],
            "name": "trio",
        },
        format="json",
    )
    assert response.status_code == 201, response.json()
    session_id = response.json()["id"]
    try:
        _wait_status(session_id, Status.RUNNING, timeout=90)
    except AssertionError:
        print(live_system.agent_log("node-a")[-3000:], live_system.agent_log("node-b")[-3000:])
        raise

    kernels = {k.cluster_hostname: k for k in Kernel.objects.filter(session_id=session_id)}
    assert {k.agent_id for k in kernels.values()} == {"node-a", "node-b"}  # 2 cpu each: it spread
    containers = {
        h: engine.containers.get(cid) for h, cid in _containers(engine, session_id).items()
    }
    assert sorted(containers) == ["main1", "sub1", "sub2"]
    for hostname, container in containers.items():
        kernel = kernels[hostname]
        code, env_text = _exec(container, "env")
        env = dict(line.split("=", 1) for line in env_text.splitlines() if "=" in line)
        assert env["BACKENDAI_CLUSTER_HOST"] == hostname
        assert env["BACKENDAI_CLUSTER_HOSTS"] == "main1,sub1,sub2"
        assert env["BACKENDAI_CLUSTER_IDX"] == str(kernel.cluster_idx)
        assert env["BACKENDAI_CLUSTER_LOCAL_RANK"] == str(kernel.local_rank)
        assert env["BACKENDAI_CLUSTER_MODE"] == "multi-node"
        assert env["BACKENDAI_CLUSTER_ROLE"] == ("main" if hostname == "main1" else "sub")
        assert env["BACKENDAI_CLUSTER_SIZE"] == "3"
        assert env["BACKENDAI_KERNEL_ID"] == str(kernel.pk)
        assert env["BACKENDAI_SESSION_ID"] == session_id
        assert _exec(container, "hostname") == (0, hostname)
        assert _exec(container, "id -u")[1] != "0"
        attrs = container.attrs["HostConfig"]
        assert attrs["Privileged"] is False
        assert attrs["NanoCpus"] == 1_000_000_000
        assert attrs["Memory"] == 256 * 2**20
    assert kernels["main1"].pk == kernels["main1"].session_id

    main1 = containers["main1"]
    # Kernels reach each other by hostname on the session's private network.
    code, out = _exec(main1, "python3 -c \"import socket; print(socket.gethostbyname('sub2'))\"")
    assert code == 0 and out.count(".") == 3, out
    # A file written to the data folder in sub2 is read in main1.
    assert _exec(containers["sub2"], "echo from-sub2 > /home/work/shared/note.txt")[0] == 0
    assert _exec(main1, "cat /home/work/shared/note.txt") == (0, "from-sub2")
    assert (
        DataFolder.objects.get(name="shared").host_path / "note.txt"
    ).read_text() == "from-sub2\n"
    # ssh sub1 works from main1 with no password, and sees sub1's own environment.
    code, out = _exec(main1, "ssh -o BatchMode=yes sub1 hostname")
    assert (code, out) == (0, "sub1"), out
    code, out = _exec(main1, "ssh -o BatchMode=yes sub1 'echo $BACKENDAI_CLUSTER_HOST'")
    assert (code, out) == (0, "sub1"), out
    # ... and yet no part of the session's private key shows in docker inspect.
    key_lines = [
        line
        for line in Session.objects.get(pk=session_id).ssh_private_key.splitlines()
        if line and not line.startswith("-----")
    ]
    assert key_lines
    for container in containers.values():
        inspected = json.dumps(engine.api.inspect_container(container.id))
        assert not [line for line in key_lines if line in inspected]
    folder_mode = DataFolder.objects.get(name="shared").host_path.stat().st_mode
    assert stat.S_IMODE(folder_mode) & 0o007 == 0  # nothing for other users

    # Terminating leaves no container and no network behind.
    response = api(alice).post(f"/api/v1/sessions/{session_id}/terminate/", {}, format="json")
    assert response.status_code == 200
    _wait_status(session_id, Status.TERMINATED, timeout=60)
    wait_for(lambda: not _containers(engine, session_id), timeout=30, what="containers removed")
    wait_for(
        lambda: not engine.networks.list(names=[f"bai-{session_id}"]),
        timeout=30,
        what="network removed",
    )


@pytest.mark.parametrize(
    ("command", "result", "exit_code"),
    [("echo done", "SUCCESS", 0), ("echo oops; exit 3", "FAILED", 3)],
)
def test_a_batch_session_ends_by_itself_with_its_result_and_keeps_its_log(
    engine, images, fast_heartbeats, live_system, agent, api, alice, command, result, exit_code
):
    live_system.start_agent(agent)
    response = api(alice).post(
        "/api/v1/sessions/",
        {
            "image": MINIMAL_IMAGE,
            "type": "batch",
            "startup_command": command,
            "resources": {"cpu": 1, "mem": "64m"},
        },
        format="json",
    )
    assert response.status_code == 201, response.json()
    session_id = response.json()["id"]
    session = _wait_status(session_id, {Status.TERMINATED, Status.ERROR}, timeout=60)
    assert session.status == Status.TERMINATED, session.status_reason
    assert (session.result, session.exit_code) == (result, exit_code)
    main = Kernel.objects.get(pk=session_id)
    assert main.exit_code == exit_code
    wait_for(lambda: Kernel.objects.get(pk=session_id).log_tail, timeout=20, what="the log tail")
    assert command.split(";")[0].removeprefix("echo ") in Kernel.objects.get(pk=session_id).log_tail
    wait_for(lambda: not _containers(engine, session_id), timeout=30, what="containers removed")


def test_a_killed_agent_is_lost_its_session_ends_with_the_reason_and_its_slots_are_freed(
    engine, images, fast_heartbeats, live_system, agent, api, alice
):
    live_system.start_agent(agent)
    response = api(alice).post(
        "/api/v1/sessions/",
        {"image": MINIMAL_IMAGE, "resources": {"cpu": 2, "mem": "64m"}},
        format="json",
    )
    session_id = response.json()["id"]
    _wait_status(session_id, Status.RUNNING)
    assert Agent.objects.get(pk=agent.pk).occupied_slots.get("cpu") == "2"

    live_system.kill_agent(agent.pk, signal.SIGKILL)
    # The beat sweep, run here by the test: LOST once 4 s pass without a heartbeat.
    wait_for(
        lambda: sweep_lost_agents() or Agent.objects.get(pk=agent.pk).status == AgentStatus.LOST,
        timeout=20,
        what="the agent to be LOST",
    )
    lost = Agent.objects.get(pk=agent.pk)
    assert lost.status == AgentStatus.LOST
    assert "no heartbeat" in lost.status_reason
    session = Session.objects.get(pk=session_id)
    assert session.status in (Status.ERROR, Status.TERMINATED, Status.TERMINATING)
    assert "lost" in session.status_reason
    assert not Kernel.objects.filter(
        agent=agent, status__in=["SCHEDULED", "PREPARING", "RUNNING"]
    ).exists()
    assert lost.occupied_slots == {}

    # When it comes back it reports the container that still runs, and is told to destroy it.
    live_system.start_agent(agent)
    wait_for(
        lambda: Agent.objects.get(pk=agent.pk).status == AgentStatus.ALIVE, what="the agent back"
    )
    wait_for(lambda: not _containers(engine, session_id), timeout=30, what="the orphan destroyed")


def test_a_restarted_agent_adopts_its_running_containers_without_duplicates(
    engine, images, fast_heartbeats, live_system, agent, api, alice
):
    live_system.start_agent(agent)
    response = api(alice).post(
        "/api/v1/sessions/",
        {"image": MINIMAL_IMAGE, "cluster_size": 2, "resources": {"cpu": 1, "mem": "64m"}},
        format="json",
    )
    session_id = response.json()["id"]
    _wait_status(session_id, Status.RUNNING)
    before = _containers(engine, session_id)

    live_system.kill_agent(agent.pk, signal.SIGKILL)
    live_system.start_agent(agent)
    wait_for(
        lambda: (
            Agent.objects.get(pk=agent.pk).last_heartbeat_at
            and Agent.objects.get(pk=agent.pk).status_reason == "connected"
        ),
        what="the agent to reconnect",
    )
    # A few heartbeats later: same containers, same session, still running.
    first = Agent.objects.get(pk=agent.pk).last_heartbeat_at
    wait_for(lambda: Agent.objects.get(pk=agent.pk).last_heartbeat_at > first, what="a heartbeat")
    after = _containers(engine, session_id)
    assert after == before
    assert _status(session_id) == Status.RUNNING
    assert {k.container_id[:12] for k in Kernel.objects.filter(session_id=session_id)} == {
        cid[:12] for cid in before.values()
    }
