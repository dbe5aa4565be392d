"""A server process holds a bounded number of PostgreSQL connections, however
many clients arrive at once: Django's pool (``BAI_DB_POOL_MAX``) lends them
out and takes them back after each use.

Persona: ``alice``, sixteen API clients at once, all with her token.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from django.db import connection

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


def test_a_burst_of_sixteen_clients_never_holds_more_than_the_pool_maximum(
    tmp_path, group, alice, make_token
):
    if connection.vendor != "postgresql":
        skip_or_fail("the pool is PostgreSQL's: run on PostgreSQL (DATABASE_URL)")
    db = connection.settings_dict
    conninfo = psycopg.conninfo.make_conninfo(
        host=db["HOST"] or "127.0.0.1",
        port=db["PORT"] or 5432,
        dbname=db["NAME"],
        user=db["USER"],
        password=db["PASSWORD"],
    )
    url = (
        f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST'] or '127.0.0.1'}:"
        f"{db['PORT'] or 5432}/{db['NAME']}?application_name={APP_NAME}"
    )
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
