"""Reading dates PostgreSQL holds and Python cannot.

A ``timestamptz`` column holds 4713 BC to 294276 AD (and ``±infinity``);
Python's ``datetime`` holds the years 1 to 9999. A row with a date outside
that (written by hand, or by an older release that did not bound its input)
made psycopg raise DataError on every query that read it: the owner's list,
the admin's list, terminate and every scheduling pass of its group.

Such a date now reads as the nearest date Python holds (``FAR_PAST`` or
``FAR_FUTURE``, exactly ``datetime.min`` / ``datetime.max``), so the row can be
listed, ended and judged. The scheduler treats those two values as out of
range (``scheduler_app.selectors``); nothing the API accepts comes near them.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

FAR_PAST = datetime.min.replace(tzinfo=UTC)
FAR_FUTURE = datetime.max.replace(tzinfo=UTC)


def install_tolerant_dates(sender: Any, connection: Any, **kwargs: Any) -> None:
    """``connection_created`` receiver: register the loader on a new PostgreSQL connection."""
    if connection.vendor != "postgresql":
        return
    import psycopg
    from django.db.backends.postgresql.psycopg_any import BaseTzLoader

    class TolerantTzLoader(BaseTzLoader):  # type: ignore[misc, valid-type]
        # Django re-registers its own loader on a cursor whose connection's
        # loader has another timezone: keep the connection's.
        timezone = connection.timezone

        def load(self, data: Any) -> datetime:
            try:
                return super().load(data)  # type: ignore[no-any-return]
            except psycopg.DataError:
                text = bytes(data)
                # "0001-12-31 10:00:00+00 BC", "-infinity": before year 1; else after 9999.
                edge = FAR_PAST if text.endswith(b"BC") or text.startswith(b"-") else FAR_FUTURE
                return edge.replace(tzinfo=self.timezone)

    connection.connection.adapters.register_loader("timestamptz", TolerantTzLoader)
