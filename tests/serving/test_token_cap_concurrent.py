"""An endpoint's token cap holds under parallel creates.

Real transactions and row locks: PostgreSQL only, one connection per thread.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from serving_app import services
from serving_app.models import EndpointToken
from sessions_app.errors import Conflict
from tests.conftest import skip_or_fail

pytestmark = pytest.mark.django_db(transaction=True)

CREATES = 40


@pytest.fixture(autouse=True)
def _postgres_only():
    if connection.vendor != "postgresql":
        skip_or_fail("concurrency tests need PostgreSQL (set DATABASE_URL)")


def test_parallel_token_creates_never_pass_the_cap(alice, make_endpoint):
    endpoint = make_endpoint()
    start = threading.Barrier(CREATES)
    made: list[str] = []
    refused: list[str] = []
    failed: list[BaseException] = []

    def create() -> None:
        try:
            start.wait()
            token, _ = services.token_create(endpoint=endpoint, user=alice)
            made.append(token.prefix)
        except Conflict as error:
            refused.append(str(error))
        except BaseException as error:  # noqa: BLE001 - reported below
            failed.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=create) for _ in range(CREATES)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert not failed
    assert len(made) == services.MAX_TOKENS
    assert len(refused) == CREATES - services.MAX_TOKENS
    assert EndpointToken.objects.filter(endpoint=endpoint).count() == services.MAX_TOKENS
