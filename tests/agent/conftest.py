"""Fixtures for the agent's tests: a frame collector and a fake manager on loopback."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import pytest_asyncio

# The repo root and this folder on sys.path, so that `pytest` works from anywhere.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from agent_helpers import FakeManager, Frames  # noqa: E402


@pytest.fixture
def frames() -> Frames:
    return Frames()


@pytest_asyncio.fixture
async def manager():
    m = FakeManager()
    await m.start()
    yield m
    await m.stop()
