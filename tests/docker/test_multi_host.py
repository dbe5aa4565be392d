"""A multi-node cluster session across three Docker hosts on this one machine.

``scripts/cluster up`` builds the hosts: three dockerd engines, each in a network
namespace of its own, joined on a private /24 and forming a swarm of managers, with
the kernel images moved in by ``docker save``/``load``. One agent runs per engine,
dialling this test's live server. The kernels of a session meet on an internal,
attachable overlay network that spans the engines.

The test cluster has a prefix, subnet and state directory of its own, so a
developer's ``scripts/cluster`` (prefix ``baicl``) is never touched; its engines'
image stores stay cached between runs next to the kernel-image cache.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from scheduler_app.reconcile import sweep_lost_agents
from sessions_app.kernel_images import default_cache_dir
from sessions_app.models import Agent, AgentStatus, Kernel, Session, Status
from tests.conftest import skip_or_fail
from tests.live import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
PYTHON_IMAGE = "bai-kernel/python:2"
MINIMAL_IMAGE = "bai-kernel/minimal:1"
HOSTS = (1, 2, 3)
PREFIX = "baitest"
CLUSTER = {
    "BAI_CLUSTER_HOSTS": str(len(HOSTS)),
    "BAI_CLUSTER_PREFIX": PREFIX,
    "BAI_CLUSTER_NET": "10.213.1",
    "BAI_CLUSTER_DIR": str(default_cache_dir().parent / "cluster-test"),
    "BAI_CLUSTER_IMAGES": f"{PYTHON_IMAGE} {MINIMAL_IMAGE}",
}
HOSTNAMES = ("main1", "sub1", "sub2")


def cluster(*args: str, **env: str) -> str:
    """Run ``scripts/cluster``; its output, or a failure that shows it."""
    started = time.monotonic()
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "cluster"), *args],
        cwd=ROOT,
        env={**os.environ, **CLUSTER, **env},
        capture_output=True,
        text=True,
        timeout=240,
    )
    if done.returncode:
        pytest.fail(f"scripts/cluster {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    print(f"scripts/cluster {' '.join(args)}: {time.monotonic() - started:.1f} s")
    return done.stdout


@pytest.fixture(scope="module")
def engines():
    """Three engines in a swarm (built once for the module), removed at its end."""
    if os.geteuid() != 0:
        skip_or_fail("scripts/cluster needs root (network namespaces, dockerd)")
    try:
        import docker

        host = docker.from_env(timeout=30)
        for reference in (PYTHON_IMAGE, MINIMAL_IMAGE):
            host.images.get(reference)
    except Exception as exc:  # noqa: BLE001 - no engine, or no image to move
        skip_or_fail(f"the machine's engine or a kernel image is missing: {exc}")
    # One test cluster at a time on this machine (its names and cached image
    # stores are fixed): a second run waits here for the first to finish.
    state = Path(CLUSTER["BAI_CLUSTER_DIR"])
    state.parent.mkdir(parents=True, exist_ok=True)
    lock = open(state.parent / "cluster-test.lock", "a")  # noqa: SIM115 - held for the module
    deadline = time.monotonic() + 300
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                pytest.fail("another run's multi-host test held the test cluster for 5 minutes")
            time.sleep(1)
    try:
        cluster("up", BAI_CLUSTER_NO_AGENTS="1")
        clients = {
            i: docker.DockerClient(base_url=f"unix:///run/{PREFIX}/h{i}/docker.sock", timeout=30)
            for i in HOSTS
        }
        yield clients
    finally:
        try:
            cluster("down")
        finally:
            lock.close()


@pytest.fixture
def agents(engines, group, make_agent, live_system, fast_heartbeats, settings):
    """One agent a host, each holding one 1-CPU kernel: a 3-kernel session must spread."""
    rows = {i: make_agent(f"host-h{i}", cpu="1", mem=2 * 2**30) for i in HOSTS}
    start = {
        "BAI_CLUSTER_MANAGER": live_system.ws_url,
        "BAI_CLUSTER_TOKENS": ",".join(rows[i].plain_token for i in HOSTS),
        "BAI_STORAGE_ROOT": str(settings.BAI_STORAGE_ROOT),
        "BAI_CLUSTER_AGENT_ARGS": "--cpu 1 --mem 2g",
    }
    cluster("up", **start)
    wait_for(
        lambda: Agent.objects.filter(status=AgentStatus.ALIVE).count() == len(HOSTS),
        timeout=30,
        what="an agent on every host",
    )
    yield start
    cluster("stop-agents")


def agent_log(i: int) -> str:
    path = Path(CLUSTER["BAI_CLUSTER_DIR"]) / f"h{i}" / "agent.log"
    return path.read_text(errors="replace")[-3000:] if path.exists() else ""


def launch(api, user, image: str, **extra) -> str:
    response = api(user).post(
        "/api/v1/sessions/",
        {
            "image": image,
            "cluster_mode": "multi-node",
            "cluster_size": 3,
            "resources": {"cpu": 1, "mem": "256m"},
            **extra,
        },
        format="json",
    )
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def wait_status(session_id: str, wanted, timeout: float = 90) -> Session:
    wanted = {wanted} if isinstance(wanted, str) else set(wanted)

    def check():
        session = Session.objects.get(pk=session_id)
        return session if session.status in wanted else None

    try:
        return wait_for(check, timeout=timeout, what=f"session {session_id} to reach {wanted}")
    except AssertionError:
        print(*(f"--- agent h{i}\n{agent_log(i)}" for i in HOSTS), sep="\n")
        raise


def placed(engines, session_id: str) -> dict[str, tuple[int, Kernel]]:
    """hostname -> (host number, kernel): where each kernel's container really is."""
    kernels = {k.cluster_hostname: k for k in Kernel.objects.filter(session_id=session_id)}
    where = {}
    for hostname, kernel in kernels.items():
        found = [i for i in HOSTS if engines[i].api.containers(filters={"id": kernel.container_id})]
        assert len(found) == 1, (hostname, found)
        where[hostname] = (found[0], kernel)
    return where


def run(engines, host: int, container_id: str, cmd: str) -> tuple[int, str]:
    code, out = (
        engines[host].containers.get(container_id).exec_run(["sh", "-c", cmd], user="1000:1000")
    )
    return code, out.decode(errors="replace").strip()


def leftovers(engines, session_id: str) -> list[str]:
    """What the session left on any engine: its containers and its network."""
    left = []
    for i in HOSTS:
        label = f"ai.backend.session_id={session_id}"
        left += [
            f"h{i}: container {c['Id'][:12]}"
            for c in engines[i].api.containers(all=True, filters={"label": label})
        ]
        left += [
            f"h{i}: network {n['Name']}"
            for n in engines[i].api.networks(names=[f"bai-{session_id}"])
        ]
    return left


def test_a_cluster_of_three_spans_three_docker_hosts_on_one_overlay_and_behaves_as_one(
    engines, agents, images, api, alice
):
    folder = api(alice).post("/api/v1/folders/", {"name": "shared"}, format="json")
    assert folder.status_code == 201, folder.json()
    session_id = launch(api, alice, PYTHON_IMAGE, mounts=["shared"], name="trio")
    wait_status(session_id, Status.RUNNING)

    where = placed(engines, session_id)
    assert sorted(where) == list(HOSTNAMES)
    # One kernel on each host, and each on the host of the agent that runs it.
    assert sorted(host for host, _ in where.values()) == list(HOSTS)
    for host, kernel in where.values():
        assert kernel.agent_id == f"host-h{host}"

    # One internal, attachable overlay, the same network (one id) on every host.
    network_ids = set()
    addresses = {}
    for hostname, (host, kernel) in where.items():
        attrs = engines[host].api.inspect_container(kernel.container_id)
        nets = attrs["NetworkSettings"]["Networks"]
        assert list(nets) == [f"bai-{session_id}"], nets
        net = nets[f"bai-{session_id}"]
        network_ids.add(net["NetworkID"])
        assert hostname in net["Aliases"]
        addresses[hostname] = net["IPAddress"]
        info = engines[host].api.inspect_network(net["NetworkID"])
        assert (info["Driver"], info["Internal"], info["Attachable"]) == ("overlay", True, True)
    assert len(network_ids) == 1

    for hostname, (host, kernel) in where.items():
        # Every BACKENDAI_* value, in every kernel.
        code, text = run(engines, host, kernel.container_id, "env")
        env = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
        wanted = {
            "BACKENDAI_CLUSTER_HOST": hostname,
            "BACKENDAI_CLUSTER_HOSTS": "main1,sub1,sub2",
            "BACKENDAI_CLUSTER_IDX": str(kernel.cluster_idx),
            "BACKENDAI_CLUSTER_LOCAL_RANK": str(kernel.local_rank),
            "BACKENDAI_CLUSTER_MODE": "multi-node",
            "BACKENDAI_CLUSTER_ROLE": "main" if hostname == "main1" else "sub",
            "BACKENDAI_CLUSTER_SIZE": "3",
            "BACKENDAI_KERNEL_ID": str(kernel.pk),
            "BACKENDAI_SESSION_ID": session_id,
            "BACKENDAI_SESSION_NAME": "trio",
        }
        assert {k: env.get(k) for k in wanted} == wanted
        assert run(engines, host, kernel.container_id, "hostname") == (0, hostname)
        # Every hostname resolves in every kernel, to that kernel's overlay address.
        code, out = run(
            engines,
            host,
            kernel.container_id,
            "python3 -c \"import socket; print(' '.join(socket.gethostbyname(h)"
            " for h in ['main1', 'sub1', 'sub2']))\"",
        )
        assert (code, out.split()) == (0, [addresses[h] for h in HOSTNAMES]), out
        # The same data folder: each kernel writes its own file into it.
        assert (
            run(engines, host, kernel.container_id, f"echo {hostname} > shared/{hostname}")[0] == 0
        )
    assert (
        Kernel.objects.get(pk=session_id).cluster_hostname == "main1"
    )  # main1's id is the session's

    for host, kernel in where.values():
        assert run(
            engines, host, kernel.container_id, "cat shared/main1 shared/sub1 shared/sub2"
        ) == (
            0,
            "main1\nsub1\nsub2",
        )

    # ssh sub1 and ssh sub2 from main1, across hosts, each seeing its own environment.
    main_host, main_kernel = where["main1"]
    for sub in ("sub1", "sub2"):
        code, out = run(
            engines,
            main_host,
            main_kernel.container_id,
            f"ssh -o BatchMode=yes -o ConnectTimeout=10 {sub}"
            " 'hostname; echo $BACKENDAI_CLUSTER_HOST $BACKENDAI_CLUSTER_ROLE'",
        )
        assert (code, out.splitlines()) == (0, [sub, f"{sub} sub"]), out

    # Terminating leaves no container and no overlay network on any engine.
    response = api(alice).post(f"/api/v1/sessions/{session_id}/terminate/", {}, format="json")
    assert response.status_code == 200
    wait_status(session_id, Status.TERMINATED, timeout=60)
    wait_for(lambda: not leftovers(engines, session_id), timeout=30, what="nothing left behind")


def test_killing_one_hosts_agent_makes_only_that_hosts_kernel_lost(
    engines, agents, images, api, alice
):
    session_id = launch(api, alice, MINIMAL_IMAGE)
    wait_status(session_id, Status.RUNNING)
    where = placed(engines, session_id)
    victim, victim_kernel = where["sub1"]
    others = {h: hk for h, hk in where.items() if h != "sub1"}

    pidfile = Path(CLUSTER["BAI_CLUSTER_DIR"]) / f"h{victim}" / "agent.pid"
    os.kill(int(pidfile.read_text()), signal.SIGKILL)
    wait_for(
        lambda: (
            sweep_lost_agents()
            or not Agent.objects.filter(status=AgentStatus.ALIVE, pk=f"host-h{victim}").exists()
        ),
        timeout=20,
        what="the killed agent to be LOST",
    )
    statuses = dict(Agent.objects.values_list("pk", "status"))
    assert statuses == {
        f"host-h{i}": AgentStatus.LOST if i == victim else AgentStatus.ALIVE for i in HOSTS
    }
    lost = Kernel.objects.get(pk=victim_kernel.pk)
    assert lost.status == Status.ERROR
    assert f"agent host-h{victim} lost" in lost.status_reason

    # The session ends with that reason; its other kernels end normally on their
    # hosts (not lost), and the containers there go.
    session = wait_status(session_id, {Status.TERMINATED, Status.ERROR}, timeout=60)
    assert "lost" in session.status_reason
    for hostname, (_host, kernel) in others.items():
        kernel.refresh_from_db()
        assert kernel.status == Status.TERMINATED, (hostname, kernel.status, kernel.status_reason)
        assert "lost" not in (kernel.status_reason or "").split(":")[0], kernel.status_reason
    wait_for(
        lambda: all(
            not engines[host].api.containers(all=True, filters={"id": kernel.container_id})
            for host, kernel in others.values()
        ),
        timeout=30,
        what="the other hosts' containers removed",
    )
    # Nobody was there to remove the lost host's container; it still runs.
    assert engines[victim].api.containers(filters={"id": victim_kernel.container_id})

    # The agent comes back, reports it, is told to destroy it, and the overlay goes too.
    cluster("up", **agents)
    wait_for(
        lambda: Agent.objects.get(pk=f"host-h{victim}").status == AgentStatus.ALIVE,
        what="the agent back",
    )
    wait_for(lambda: not leftovers(engines, session_id), timeout=30, what="nothing left behind")
