"""The whole REST API fuzzed by schemathesis from its own OpenAPI document,
against a live daphne on the test database, with every check: no request it
makes may get a 5xx, a status code or content type the document does not
list, or a body that does not match it; schema-valid data is accepted and
schema-violating data refused (tests/integration/schemathesis.toml says where
the API refuses valid-looking data on purpose, and why).

Bounded: ``BAI_FUZZ_EXAMPLES`` examples per operation and phase (default 5;
the boundary cases of the coverage phase come on top), ``BAI_FUZZ_SEED``
fixes the data (default 1: every run sends the same requests; set another to
explore). Loopback only.

Persona: ``fuzz``, a plain user with an API token and one pending session.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import skip_or_fail

pytestmark = pytest.mark.django_db(transaction=True)

CONFIG = Path(__file__).with_name("schemathesis.toml")
EXAMPLES = os.environ.get("BAI_FUZZ_EXAMPLES", "5")
SEED = os.environ.get("BAI_FUZZ_SEED", "1")


@pytest.fixture
def fuzz_user(django_user_model, image, make_token):
    from sessions_app import services

    user = django_user_model.objects.create_user("fuzz", password="fuzz-pass-123")
    # Pending: no agent, so nothing starts, and its detail and log can be read.
    session = services.session_create(owner=user, spec={"image": image.reference})
    return make_token(user), str(session.pk)


def test_schemathesis_finds_no_server_error_and_no_answer_the_schema_does_not_describe(
    live_system, fuzz_user, tmp_path
):
    try:
        import schemathesis  # noqa: F401
    except ImportError:
        skip_or_fail("schemathesis is not installed (pip install -r requirements.txt)")
    token, session_id = fuzz_user
    command = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "--config-file",
        str(CONFIG),
        "--no-color",
        "run",
        f"{live_system.url}/api/schema/",
        "--checks",
        "all",
        "--max-examples",
        EXAMPLES,
        "--seed",
        SEED,
        "--workers",
        "1",
        "--generation-database",
        "none",
        "--request-timeout",
        "10",
        "--header",
        f"Authorization: Token {token}",
    ]
    started = time.monotonic()
    result = subprocess.run(
        command,
        cwd=tmp_path,
        env={**os.environ, "BAI_FUZZ_SESSION_ID": session_id},
        capture_output=True,
        text=True,
        timeout=240,
    )
    output = result.stdout + result.stderr
    print(f"schemathesis ran {time.monotonic() - started:.0f} s")
    # The figures, for the log of the run (pytest -s or -rA shows them).
    print("\n".join(re.findall(r"^\s*(?:Selected|Tested|\d+ generated).*$", output, re.M)))
    assert result.returncode == 0, _failures(output)
    tested = re.search(r"Tested: (\d+)", output)
    selected = re.search(r"Selected: (\d+)/(\d+)", output)
    assert tested and selected and tested.group(1) == selected.group(1) == selected.group(2)
    generated = re.search(r"(\d+) generated, (\d+) passed", output)
    assert generated and generated.group(1) == generated.group(2) and int(generated.group(1)) > 500


def _failures(output: str) -> str:
    """What schemathesis found, each line cut short (a request body may be 60 KB)."""
    start = output.find("FAILURES")
    lines = output[start if start >= 0 else 0 :].splitlines()
    return "\n".join(line[:300] for line in lines)[-30_000:]
