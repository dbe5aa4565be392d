"""A server process holds a bounded number of PostgreSQL connections, however
many clients arrive at once: Django's pool (``BAI_DB_POOL_MAX``) lends them
out and takes them back after each use. A connection the server closed (a
restart, ``pg_terminate_backend``) is replaced before a request gets it, though
the pool asks the server only when it has a reason to (``backendai_web/db.py``).

Persona: ``alice``, sixteen API clients at once, all with her token.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from django.db import connection

from backendai_web import db as bai_db
from tests.conftest import skip_or_fail
from tests.live import LiveSystem

pytestmark = pytest.mark.django_db(transaction=True)

POOL_MAX = 4
CLIENTS = 16
REQUESTS_EACH = 10
APP_NAME = "bai-pool-burst"


def _server_connections(conninfo: str) -> int:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        return conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = %s",
            [APP_NAME],
        ).fetchone()[0]


def _conninfo() -> str:
    if connection.vendor != "postgresql":
        skip_or_fail("the pool is PostgreSQL's: run on PostgreSQL (DATABASE_URL)")
    db = connection.settings_dict
    return psycopg.conninfo.make_conninfo(
        host=db["HOST"] or "127.0.0.1",
        port=db["PORT"] or 5432,
        dbname=db["NAME"],
        user=db["USER"],
        password=db["PASSWORD"],
    )


def _server_url(application_name: str) -> str:
    db = connection.settings_dict
    return (
        f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST'] or '127.0.0.1'}:"
        f"{db['PORT'] or 5432}/{db['NAME']}?application_name={application_name}"
    )


def _terminate(conninfo: str, application_name: str) -> int:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        return len(
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name = %s",
                [application_name],
            ).fetchall()
        )


def _get(url: str, token: str) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Token {token}"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310 - loopback
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_a_burst_of_sixteen_clients_never_holds_more_than_the_pool_maximum(
    tmp_path, group, alice, make_token
):
    conninfo = _conninfo()
    url = _server_url(APP_NAME)
    token = make_token(alice)
    system = LiveSystem(tmp_path).start(
        DATABASE_URL=url, BAI_DB_POOL_MIN="1", BAI_DB_POOL_MAX=str(POOL_MAX)
    )
    peak = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, _server_connections(conninfo))
            time.sleep(0.01)

    def client(_: int) -> list[int]:
        statuses = []
        for _ in range(REQUESTS_EACH):
            request = urllib.request.Request(
                f"{system.url}/api/v1/sessions/", headers={"Authorization": f"Token {token}"}
            )
            with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310 - loopback
                json.load(response)
                statuses.append(response.status)
        return statuses

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        with ThreadPoolExecutor(CLIENTS) as pool:
            statuses = [s for batch in pool.map(client, range(CLIENTS)) for s in batch]
    finally:
        stop.set()
        sampler.join()
        system.stop()

    assert statuses == [200] * (CLIENTS * REQUESTS_EACH)
    assert 1 <= peak <= POOL_MAX, f"the server held {peak} connections"


def test_a_request_after_the_server_closed_the_pools_connections_gets_a_new_one(
    tmp_path, group, alice, make_token
):
    conninfo = _conninfo()
    name = "bai-pool-terminated"
    token = make_token(alice)
    system = LiveSystem(tmp_path).start(
        DATABASE_URL=_server_url(name), BAI_DB_POOL_MIN="2", BAI_DB_POOL_MAX="2"
    )
    try:
        sessions = f"{system.url}/api/v1/sessions/"
        assert _get(sessions, token) == 200
        assert _terminate(conninfo, name) >= 1
        time.sleep(0.2)  # the server's goodbye reaches the pooled sockets
        assert [_get(sessions, token) for _ in range(4)] == [200] * 4
    finally:
        system.stop()


@pytest.mark.parametrize("why", ["terminated", "idle too long"])
def test_the_pool_never_hands_out_a_connection_the_server_closed(why, monkeypatch):
    from psycopg_pool import ConnectionPool

    conninfo = _conninfo()
    name = f"bai-pool-check-{why.replace(' ', '-')}"
    pool = ConnectionPool(
        conninfo,
        kwargs={"application_name": name, "autocommit": True},
        min_size=1,
        max_size=1,
        check=bai_db.check_pooled_connection,
        open=True,
    )
    try:
        with pool.connection() as conn:
            first = conn.info.backend_pid
        if why == "terminated":
            assert _terminate(conninfo, name) == 1
            time.sleep(0.2)
        else:
            # A backend that vanished without a word (its host went away) leaves a
            # quiet socket: after FULL_CHECK_AFTER the pool asks the server anyway.
            calls = []
            monkeypatch.setattr(
                ConnectionPool, "check_connection", staticmethod(lambda c: calls.append(c))
            )
            monkeypatch.setattr(bai_db, "FULL_CHECK_AFTER", 0.0)
        with pool.connection() as conn:
            if why == "terminated":
                assert conn.info.backend_pid != first
                assert conn.execute("SELECT 1").fetchone() == (1,)
            else:
                assert calls == [conn]
    finally:
        pool.close()


@pytest.fixture
def pooled(monkeypatch):
    """The test's connection lent by a pool, as in a server (tests run without one)."""
    _conninfo()
    connection.close()
    monkeypatch.setitem(connection.settings_dict["OPTIONS"], "pool", {"min_size": 1, "max_size": 1})
    yield connection
    connection.close()
    connection.close_pool()


def test_djangos_pool_hands_out_a_connection_in_steady_use_without_a_round_trip(
    pooled, monkeypatch
):
    for _ in range(2):  # the first loan puts the check in place, the second is its first look
        pooled.ensure_connection()
        pooled.close()
    asked = []
    execute = psycopg.Connection.execute

    def recording(conn, query, *args, **kwargs):
        asked.append(query)
        return execute(conn, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "execute", recording)
    for _ in range(3):
        with pooled.cursor() as cursor:
            cursor.execute("SELECT 1")
        pooled.close()
    assert pooled.pool is not None
    assert "" not in asked  # the pool's round trip (an empty query)
