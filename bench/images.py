"""Time the kernel image builds without touching the real tags.

    python bench/images.py          # minimal build, python import from the cached tarball
    python bench/images.py --cold   # plus a from-scratch python root (debootstrap, ~30-40 s)

Imports go to ``bai-bench/*`` tags that are removed afterwards; ``--cold`` builds into a temporary
cache directory, so the real cache and ``bai-kernel/*`` images stay as they are.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import docker  # noqa: E402

from sessions_app import kernel_images as images  # noqa: E402


def _timed_import(client: docker.DockerClient, src: str | bytes, ref: str) -> float:
    t0 = time.monotonic()
    images._import(client, "bench: import", src, ref, [f"LABEL {images.RECIPE_LABEL}=bench"])
    took = time.monotonic() - t0
    size = client.images.get(ref).attrs["Size"]
    client.images.remove(ref, force=True)
    print(f"  {ref}: {size / 1e6:.0f} MB")
    return took


def _start_time(client: docker.DockerClient, ref: str) -> float:
    t0 = time.monotonic()
    c = client.containers.run(ref, ["true"], detach=True, user="1000:1000", cap_drop=["ALL"])
    took = time.monotonic() - t0
    c.wait()
    c.remove(force=True)
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cold", action="store_true", help="also build the python root from scratch")
    ap.add_argument(
        "--smoke", action="store_true", help="the minimal image only (the test suite runs it so)"
    )
    args = ap.parse_args()
    client = docker.from_env()

    t0 = time.monotonic()
    data = images.minimal_rootfs_tar()
    tar_s = time.monotonic() - t0
    imp_s = _timed_import(client, data, "bai-bench/minimal:1")
    print(f"minimal: tar {tar_s:.3f} s, import {imp_s:.3f} s, total {tar_s + imp_s:.2f} s")

    if args.smoke:
        return
    tarball = images.python_tarball_path()
    if tarball.is_file():
        imp_s = _timed_import(client, str(tarball), "bai-bench/python:1")
        print(
            f"python (cached tarball {tarball.stat().st_size / 1e6:.0f} MB): import {imp_s:.1f} s"
        )
    else:
        print(f"python: no cached tarball at {tarball}; run `manage.py build_kernel_images` first")

    t0 = time.monotonic()
    images.build_python(client=client)  # engine hit when the image is current
    print(f"python (already in the engine): {time.monotonic() - t0:.3f} s")

    for ref in (images.MINIMAL_IMAGE, images.PYTHON_IMAGE):
        if images.image_present(client, ref):
            print(f"docker run -d {ref}: {_start_time(client, ref):.2f} s")

    if args.cold:
        with tempfile.TemporaryDirectory(prefix="bai-bench-") as tmp:
            cold = Path(tmp) / tarball.name
            t0 = time.monotonic()
            images._build_python_tarball(lambda m: print("  " + m), cold, "bench")
            build_s = time.monotonic() - t0
            imp_s = _timed_import(client, str(cold), "bai-bench/python:1")
            print(f"python cold: root tarball {build_s:.1f} s + import {imp_s:.1f} s")


if __name__ == "__main__":
    main()
