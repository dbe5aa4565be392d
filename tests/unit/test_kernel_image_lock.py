"""``build_kernel_images`` while another process builds the same image: it says it
waits for that build and, once it is done, that it waited and for how long, never
"already present" followed by the wait passed off as its own build time."""

from __future__ import annotations

import io
import threading
import time

from django.core.management import call_command

from sessions_app import kernel_images


class FakeImage:
    labels: dict = {}
    attrs = {"Size": 600 * 2**20}
    id = "sha256:feed"


class FakeEngine:
    """An engine where the Python image appears when the other build finishes."""

    def __init__(self):
        self.present = False
        self.images = self

    def get(self, reference):
        return FakeImage()


def _other_build(tarball, engine, held: threading.Event, seconds: float):
    with kernel_images.build_lock(tarball.with_suffix(".lock")):
        held.set()
        time.sleep(seconds)
        engine.present = True


def test_a_build_that_waits_for_another_says_so_and_reports_the_wait(monkeypatch, tmp_path):
    monkeypatch.setenv("BAI_IMAGE_CACHE", str(tmp_path))
    engine = FakeEngine()
    monkeypatch.setattr(kernel_images, "_client", lambda client: engine)
    monkeypatch.setattr(kernel_images, "_present_with_recipe", lambda c, ref, r: engine.present)
    built = []
    monkeypatch.setattr(kernel_images, "_build_python_tarball", lambda *a: built.append(a))
    tarball = kernel_images.python_tarball_path(None, kernel_images.PYTHON_ROOT)
    held = threading.Event()
    other = threading.Thread(target=_other_build, args=(tarball, engine, held, 1.5))
    other.start()
    held.wait(5)
    out = io.StringIO()
    call_command("build_kernel_images", "--only", "python", "--no-register", stdout=out)
    other.join()
    lines = out.getvalue().splitlines()
    assert built == []  # nothing built twice
    assert lines[0] == "python: another process is building bai-kernel/python:2; waiting for it"
    assert lines[1].startswith("python: waited 1.")
    assert "for another process's build; bai-kernel/python:2 is present now" in lines[1]
    assert not any("already present" in line for line in lines)
    assert lines[-1].startswith("bai-kernel/python:2: waited 1.")
    assert lines[-1].endswith(" s for another process's build")


def test_an_image_present_at_once_is_still_already_present(monkeypatch, tmp_path):
    monkeypatch.setenv("BAI_IMAGE_CACHE", str(tmp_path))
    engine = FakeEngine()
    engine.present = True
    monkeypatch.setattr(kernel_images, "_client", lambda client: engine)
    monkeypatch.setattr(kernel_images, "_present_with_recipe", lambda c, ref, r: engine.present)
    out = io.StringIO()
    call_command("build_kernel_images", "--only", "python", "--no-register", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("python: bai-kernel/python:2 already present (recipe ")
    assert lines[-1].startswith("bai-kernel/python:2: engine, ")
