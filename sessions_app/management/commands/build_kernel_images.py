"""Build the project's kernel images locally (no registry is reachable) and
register them as images. Cached outside the repo, so a rebuild takes seconds."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from sessions_app import kernel_images as images
from sessions_app.models import Image

IMAGE_INFO = {
    "bai-kernel/minimal:1": {
        "display_name": "Minimal (busybox)",
        "description": "A 2 MB busybox shell: fast to start; no SSH.",
        "min_slots": {"cpu": "0.1", "mem": str(16 * 2**20)},
    },
    "bai-kernel/python:2": {
        "display_name": "Python 3 + SSH + Jupyter (Debian bookworm)",
        "description": "Python 3, Jupyter Notebook, an SSH server and client: `ssh sub1` works.",
        "service_ports": [images.JUPYTER_APP],
        "min_slots": {"cpu": "0.25", "mem": str(64 * 2**20)},
    },
    images.SFTP_IMAGE: {
        "display_name": "SFTP (system sessions)",
        "description": "The SFTP server of the data folders' system sessions (asyncssh).",
        "min_slots": {"cpu": "0.1", "mem": str(64 * 2**20)},
    },
    images.SKLEARN_SERVE_IMAGE: {
        "display_name": "Iris classifier (scikit-learn + FastAPI, Debian bookworm)",
        "description": (
            "A model server for inference endpoints: POST /predict, GET /health on the "
            "endpoint's port; it serves with no start command."
        ),
        "serve_command": images.SKLEARN_SERVE_COMMAND,
        "min_slots": {"cpu": "0.25", "mem": str(256 * 2**20)},
    },
}


def _how(result: images.BuiltImage) -> str:
    """Where the image came from and how long that took: "built, 61.2 s", "engine, 0.1 s";
    a wait for another process's build is said as one, not as a build time."""
    if result.source == "waited":
        return f"waited {result.seconds:.1f} s for another process's build"
    return f"{result.source}, {result.seconds:.1f} s"


class Command(BaseCommand):
    help = "Build (or reuse from cache) the kernel images and register them."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--force", action="store_true", help="rebuild even when cached")
        parser.add_argument(
            "--only",
            choices=["minimal", "python", "sftp", "sklearn-serve"],
            help="build just one of the images",
        )
        parser.add_argument(
            "--quiet-if-cached", action="store_true", help="print nothing when nothing was built"
        )
        parser.add_argument(
            "--no-register",
            action="store_true",
            help="only build; do not record the images in the database (the test set-up)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        lines: list[str] = []

        def progress(message: str) -> None:
            lines.append(message)
            if not options["quiet_if_cached"]:
                self.stdout.write(message)

        builders = {
            "minimal": images.build_minimal,
            "python": images.build_python,
            "sftp": images.build_sftp,
            "sklearn-serve": images.build_sklearn_serve,
        }
        wanted = [options["only"]] if options["only"] else list(builders)
        built = []
        try:
            for name in wanted:
                built.append(builders[name](progress, None, options["force"]))
        except images.ImageBuildError as exc:
            for line in lines if options["quiet_if_cached"] else []:
                self.stderr.write(line)
            raise CommandError(str(exc)) from exc
        for result in built:
            how = _how(result)
            if options["no_register"]:
                if result.source != "engine" or not options["quiet_if_cached"]:
                    self.stdout.write(f"{result.reference}: {how}")
                continue
            info = IMAGE_INFO.get(result.reference, {})
            image, created = Image.objects.update_or_create(
                reference=result.reference,
                defaults={"supports_ssh": result.supports_ssh, "is_active": True, **info},
            )
            if created or result.source != "engine" or not options["quiet_if_cached"]:
                self.stdout.write(
                    f"{image.reference}: {result.size_bytes / 2**20:.1f} MB, "
                    f"{how}{' (registered)' if created else ''}"
                )
