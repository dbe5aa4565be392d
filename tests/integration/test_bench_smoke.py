"""Every benchmark under ``bench/`` still runs: each script, at its smallest (``--smoke``).

The scripts are found by themselves (every ``bench/*.py`` that runs as a program), so a
new bench without ``--smoke``, or one that no longer runs, fails here. Figures are not
judged, only that the script ran to its end and printed its figures. Each runs in a
fresh process against a throwaway database of this test's, on the project's kernel
images (Docker), as bench/README.md runs them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from tests.live import ROOT

BENCH = ROOT / "bench"


def bench_scripts() -> list[str]:
    """Every script of bench/ (a module that only serves others, bare_asgi.py, is none)."""
    return sorted(
        p.name
        for p in BENCH.glob("*.py")
        if re.search(r"^if __name__ == .__main__.:", p.read_text(), re.M)
    )


# What each prints once it has measured (a line of its figures); a new bench adds its own.
FIGURES = {
    "apps.py": r"requests/s",
    "exec.py": r"streamed output",
    "exec_lean.py": r"lean",
    "folders.py": r"MB/s",
    "folders_sftp.py": r"MB/s",
    "images.py": r"minimal: tar [\d.]+ s, import [\d.]+ s",
    "launch.py": r"1 kernel\(s\): API→RUNNING median \d+ ms",
    "load.py": r"sessions started: \d+",
    "scheduler.py": r"placements/s",
    "scheduler_policy.py": r"sessions placed/s|placed",
    "serve.py": r"requests/s",
    "streams.py": r"lines/s, 0 out of order",
}


@pytest.fixture
def bench_database(django_db_setup, django_db_blocker):
    """A fresh database for each bench (they migrate and fill it): the agents a bench
    leaves registered (their processes gone) and its sessions are no other bench's."""
    with django_db_blocker.unblock():
        db = dict(connection.settings_dict)
    name = f"{db['NAME']}_bench"
    params = {
        "host": db["HOST"] or "127.0.0.1",
        "port": db["PORT"] or 5432,
        "user": db["USER"],
        "password": db["PASSWORD"],
        "dbname": "postgres",
        "autocommit": True,
    }
    with psycopg.connect(**params) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    url = f"postgres://{db['USER']}:{db['PASSWORD']}@{params['host']}:{params['port']}/{name}"
    yield url
    with psycopg.connect(**params) as admin:
        for made in (name, f"{name}_launch"):  # launch.py makes a database of its own
            admin.execute(f'DROP DATABASE IF EXISTS "{made}" WITH (FORCE)')


def test_every_bench_script_is_known_here():
    assert bench_scripts() == sorted(FIGURES), "a new bench: add the line of its figures"


@pytest.mark.docker
@pytest.mark.timeout(600)
@pytest.mark.parametrize("script", bench_scripts())
def test_the_bench_runs_at_its_smallest(script, bench_database, settings, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BAI_", "DJANGO_"))}
    env.update(DATABASE_URL=bench_database, REDIS_URL=settings.REDIS_URL)
    args = [sys.executable, str(BENCH / script), "--smoke"]
    if script == "scheduler.py":
        args += ["--database-url", bench_database]
    if script == "launch.py":  # it drops and makes its database: one apart, so that no
        # other bench finds the agent it left (which no longer runs) and places there
        args += ["--database-url", f"{bench_database}_launch"]
    result = subprocess.run(
        args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=540
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert re.search(FIGURES[script], result.stdout), output[-4000:]


def test_the_bench_scripts_are_found_by_themselves():
    assert "streams.py" in bench_scripts()
    assert "bare_asgi.py" not in bench_scripts()  # an ASGI app for exec.py, not a script
    assert all(Path(BENCH / name).is_file() for name in bench_scripts())
