"""Fixtures for the agent's tests: a frame collector and a fake manager on loopback."""

from __future__ import annotations

import shutil
import sys
import tempfile
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


@pytest.fixture
def base_dir():
    """A directory kernels may pass through. pytest's tmp_path is 0700, and a process
    kernel running as a uid of its own must reach its home and data folders by path."""
    path = Path(tempfile.mkdtemp(prefix="bai-agent-test-"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)
