"""Advisory locks of the scheduler, keyed in one dict."""

from __future__ import annotations

from django.db import connection

# Advisory-lock keys, all in one place: (namespace, object id).
LOCKS = {"resource_group": 7301}


def lock_group(group_id: int) -> None:
    """Serialise passes and agent loss per resource group across processes.

    PostgreSQL: a transaction-scoped advisory lock. SQLite: the write
    transaction itself is exclusive (transaction_mode IMMEDIATE).
    """
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_advisory_xact_lock(%s, %s)", [LOCKS["resource_group"], group_id]
            )
