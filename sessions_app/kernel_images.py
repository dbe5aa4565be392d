"""Build the project's own kernel images locally (no registry is reachable).

Four images:

* ``bai-kernel/minimal:1`` -- Debian's static busybox plus applet symlinks, a ``work`` user
  (uid/gid 1000) and nothing else. Built in memory with :mod:`tarfile` in ~0.1 s.
* ``bai-kernel/python:2`` -- a ``debootstrap --variant=minbase`` bookworm root with python3,
  openssh-server/-client, iproute2 and procps. Takes ~40 s cold; the finished root tarball is cached
  outside the repository keyed on a hash of its recipe, so later builds only ``docker import`` it.
* ``bai-kernel/sftp:2`` -- the same kind of root with python3, python3-asyncssh and
  openssh-server only, for the SFTP system sessions (the agent writes its server into the
  kernel's home; sshd carries SSH, our Python serves SFTP behind it). Cached alike. ``:1`` had
  no sshd: a new tag, so that an agent never runs the new server on the old image.
* ``bai-kernel/sklearn-serve:1`` -- the same kind of root with Debian's scikit-learn, FastAPI and
  uvicorn, an iris classifier trained when the image is built (from the iris data scikit-learn
  ships) and its model server in ``/opt/model`` (``image_files/sklearn_serve/``). Its default
  serving command, ``SKLEARN_SERVE_COMMAND`` (registered as the image's ``serve_command``), serves
  it on the endpoint's port; nothing is downloaded at run time. Cached alike.

Both images carry the label ``ai.backend.recipe=<hash>``; an image already in the engine with the
same label is left alone. Root tarballs never carry xattrs (file capabilities break binaries such
as ``ping`` under ``--cap-drop ALL``).

Manager-side: ``manage.py build_kernel_images`` builds and registers these images; the agent never
builds images, it only runs them. Plain Python all the same: this module imports no Django, so it
also runs on its own (``python -m sessions_app.kernel_images [--force]``). The ``docker`` SDK is
imported lazily, only when no client is passed in.

Public API::

    build_all(progress, cache_dir=None, force=False, client=None) -> list[BuiltImage]
    build_minimal(progress, cache_dir=None, force=False, client=None) -> BuiltImage
    build_python(progress, cache_dir=None, force=False, client=None) -> BuiltImage
    build_sftp(progress, cache_dir=None, force=False, client=None) -> BuiltImage
    build_sklearn_serve(progress, cache_dir=None, force=False, client=None) -> BuiltImage
    MINIMAL_IMAGE, PYTHON_IMAGE, RECIPE_LABEL, SSH_LABEL, ImageBuildError, BuiltImage
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import io
import json
import os
import platform
import shutil
import struct
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MINIMAL_IMAGE = "bai-kernel/minimal:1"
PYTHON_IMAGE = "bai-kernel/python:2"
SFTP_IMAGE = "bai-kernel/sftp:2"
SKLEARN_SERVE_IMAGE = "bai-kernel/sklearn-serve:1"

RECIPE_LABEL = "ai.backend.recipe"
SSH_LABEL = "ai.backend.supports-ssh"  # "true" when the image carries /usr/sbin/sshd

KERNEL_UID = 1000
KERNEL_GID = 1000
KERNEL_USER = "work"
KERNEL_HOME = "/home/work"

BUSYBOX_PATH = "/bin/busybox"

# Bump when the build procedure changes in a way the hashed recipe below would not capture.
RECIPE_VERSION = 1
PYTHON_SUITE = "bookworm"
PYTHON_PACKAGES = (
    "python3",
    "openssh-server",
    "openssh-client",
    "iproute2",
    "procps",
    "jupyter-notebook",
)
# The SFTP system sessions' kernel: python3, Debian's asyncssh (2.10.1 in bookworm) for its
# SFTP/SCP server code, and OpenSSH's sshd (9.2) for the SSH side. The server itself is the
# agent's (agent/sftp_server.py), written into the kernel's home at start, so it always matches
# the agent that runs it.
SFTP_PACKAGES = ("python3", "python3-asyncssh", "openssh-server")
# The model image: Debian's scikit-learn (with its bundled iris data), FastAPI and uvicorn.
SKLEARN_SERVE_PACKAGES = ("python3", "python3-sklearn", "python3-fastapi", "uvicorn")
SKLEARN_SERVE_FILES = Path(__file__).with_name("image_files") / "sklearn_serve"
SKLEARN_SERVE_DIR = "/opt/model"
SKLEARN_SERVE_PORT = 8000
# The image's default serving command (an endpoint with no start command runs it): on the
# endpoint's port ($BAI_SERVE_PORT, set in every replica), else on SKLEARN_SERVE_PORT.
SKLEARN_SERVE_COMMAND = (
    f"exec uvicorn --app-dir {SKLEARN_SERVE_DIR} serve:app --host 0.0.0.0 "
    f'--port "${{BAI_SERVE_PORT:-{SKLEARN_SERVE_PORT}}}"'
)
# Runs in the chroot after the packages are in: train the model, compile the server (the kernel's
# root is read-only, so Python could not write its bytecode cache at run time).
_SKLEARN_SERVE_SCRIPT = f"""\
set -eu
cd {SKLEARN_SERVE_DIR}
python3 train.py {SKLEARN_SERVE_DIR}/iris.joblib
python3 -m compileall -q {SKLEARN_SERVE_DIR}
python3 -c 'import sys; sys.path.insert(0, "{SKLEARN_SERVE_DIR}"); import serve'
"""

# The Python image's intrinsic app. The agent runs the start command on demand (the
# first time the app is opened), as the kernel user in the home, with the address
# ($BAI_APP_BIND, $BAI_APP_PORT) and the secret the proxy presents ($BAI_APP_TOKEN).
JUPYTER_PORT = 8888
JUPYTER_APP = {
    "name": "jupyter",
    "protocol": "http",
    "port": JUPYTER_PORT,
    "start_command": (
        'exec jupyter notebook --no-browser --ip="$BAI_APP_BIND" --port="$BAI_APP_PORT" '
        '--NotebookApp.token="$BAI_APP_TOKEN" --NotebookApp.password= '
        '--NotebookApp.allow_remote_access=True --NotebookApp.notebook_dir="$HOME" '
        "--NotebookApp.port_retries=0"
    ),
}

Progress = Callable[[str], None]
# A wait for another process's build lock at least this long (seconds) is reported as such.
LOCK_WAIT_NOTICE = 1.0

_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Runs inside the chroot (/bin/sh is dash in the minbase root). Part of the recipe hash.
_PYTHON_SETUP_SCRIPT = """\
set -eu
export DEBIAN_FRONTEND=noninteractive PATH=/usr/sbin:/usr/bin:/sbin:/bin
printf '%s\\n' \\
  'path-exclude /usr/share/doc/*' 'path-include /usr/share/doc/*/copyright' \\
  'path-exclude /usr/share/man/*' 'path-exclude /usr/share/info/*' \\
  'path-exclude /usr/share/locale/*' 'path-include /usr/share/locale/locale.alias' \\
  'path-exclude /usr/share/lintian/*' > /etc/dpkg/dpkg.cfg.d/excludes
apt-get -q -o Acquire::Languages=none update
apt-get -q -y --no-install-recommends -o Dpkg::Options::=--force-unsafe-io install {packages}
groupadd --gid {gid} {user}
useradd --uid {uid} --gid {gid} --create-home --home-dir {home} --shell /bin/bash {user}
chmod 0755 {home}
apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/debconf/*-old /var/lib/dpkg/*-old
rm -f /var/log/apt/* /var/log/dpkg.log /var/log/alternatives.log /var/log/bootstrap.log
rm -f /etc/ssh/ssh_host_*
find /usr/share/doc -mindepth 1 ! -type d ! -name copyright -delete
find /usr/share/doc -mindepth 1 -type d -empty -delete
find /usr/share/locale -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf -- '{{}}' +
rm -rf /usr/share/man/* /usr/share/info/* /usr/share/lintian
install -d -m 0755 -o root -g root /run/sshd
: > /etc/resolv.conf
: > /etc/hostname
rm -f /usr/sbin/policy-rc.d
"""


class ImageBuildError(RuntimeError):
    """A kernel image could not be built; the message names the step and the cause."""


@dataclass(frozen=True)
class BuiltImage:
    reference: str
    size_bytes: int
    supports_ssh: bool
    built_from_cache: bool  # True when nothing had to be built from scratch
    seconds: float
    recipe_hash: str = ""
    image_id: str = ""
    # "engine" (already present), "cache" (tarball imported), "built", or "waited" (another
    # process built it while this one waited for the build lock: ``seconds`` is that wait)
    source: str = ""


# --------------------------------------------------------------------------- helpers


def default_cache_dir() -> Path:
    env = os.environ.get("BAI_IMAGE_CACHE")
    if env:
        return Path(env).expanduser()
    return Path("~/.cache/backendai-web/images").expanduser()


def _client(client: Any) -> Any:
    if client is not None:
        return client
    try:
        import docker
    except ImportError as exc:  # pragma: no cover - docker is a project dependency
        raise ImageBuildError("the `docker` Python package is not installed") from exc
    try:
        c = docker.from_env()
        c.ping()
    except Exception as exc:
        raise ImageBuildError(f"no Docker engine answers: {exc}") from exc
    return c


def _image_or_none(client: Any, reference: str) -> Any:
    import docker.errors

    try:
        return client.images.get(reference)
    except docker.errors.ImageNotFound:
        return None


def _present_with_recipe(client: Any, reference: str, recipe: str) -> Any:
    img = _image_or_none(client, reference)
    if img is not None and (img.labels or {}).get(RECIPE_LABEL) == recipe:
        return img
    return None


def _tail(text: str | bytes, lines: int = 15) -> str:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return "\n".join(text.strip().splitlines()[-lines:])


def _run(step: str, cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
    try:
        proc = subprocess.run(cmd, capture_output=True, **kwargs)
    except FileNotFoundError as exc:
        raise ImageBuildError(f"{step}: command not found: {cmd[0]}") from exc
    if proc.returncode != 0:
        out = _tail(proc.stderr) or _tail(proc.stdout)
        shown = " ".join(cmd[:4]) + (" ..." if len(cmd) > 4 else "")
        raise ImageBuildError(f"{step}: `{shown}` exited {proc.returncode}:\n{out}")
    return proc


def _import(client: Any, step: str, src: str | bytes, reference: str, changes: list[str]) -> str:
    """``docker import`` a root tarball (a path or bytes); return the new image id."""
    repo, tag = reference.rsplit(":", 1)
    previous = _image_or_none(client, reference)
    try:
        if isinstance(src, bytes):
            out = client.api.import_image_from_data(src, repository=repo, tag=tag, changes=changes)
        else:
            out = client.api.import_image_from_file(src, repository=repo, tag=tag, changes=changes)
    except Exception as exc:
        raise ImageBuildError(f"{step}: docker import failed: {exc}") from exc
    image_id = ""
    for line in (out if isinstance(out, str) else json.dumps(out)).splitlines():
        with contextlib.suppress(ValueError):
            msg = json.loads(line)
            if isinstance(msg, dict) and (msg.get("error") or msg.get("errorDetail")):
                raise ImageBuildError(f"{step}: docker import failed: {msg}")
            if isinstance(msg, dict) and str(msg.get("status", "")).startswith("sha256:"):
                image_id = msg["status"]
    if previous is not None and previous.id != image_id:
        # The tag moved; drop the old image unless a container still uses it.
        with contextlib.suppress(Exception):
            client.images.remove(previous.id)
    return image_id


def _image_config(
    rootfs_hash: str, supports_ssh: bool, cmd: str, env: dict[str, str]
) -> tuple[str, list[str]]:
    """The ``docker import --change`` lines and the recipe label value they end with.

    The label hashes the root filesystem's recipe together with this configuration, so a change
    to either re-imports the image, while the cached root tarball stays keyed on the rootfs alone.
    """
    config = [
        f"LABEL {SSH_LABEL}={'true' if supports_ssh else 'false'}",
        f"ENV {' '.join(f'{k}={v}' for k, v in env.items())}" if env else "",
        f"WORKDIR {KERNEL_HOME}",
        f"CMD {json.dumps([cmd])}",
    ]
    config = [line for line in config if line]
    blob = "\n".join([rootfs_hash, *config]).encode()
    recipe = hashlib.sha256(blob).hexdigest()[:16]
    return recipe, [*config, f"LABEL {RECIPE_LABEL}={recipe}"]


def _result(client: Any, reference: str, recipe: str, started: float, source: str) -> BuiltImage:
    img = client.images.get(reference)
    labels = img.labels or {}
    return BuiltImage(
        reference=reference,
        size_bytes=int(img.attrs.get("Size") or 0),
        supports_ssh=labels.get(SSH_LABEL) == "true",
        built_from_cache=source != "built",
        seconds=round(time.monotonic() - started, 3),
        recipe_hash=recipe,
        image_id=img.id,
        source=source,
    )


def _is_static_elf(path: str) -> bool:
    """True when ``path`` is an ELF executable without a PT_INTERP (dynamic loader) header."""
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF":
            return False
        is64 = head[4] == 2
        end = "<" if head[5] == 1 else ">"
        if is64:
            phoff, phentsize, phnum = (
                struct.unpack_from(end + "Q", head, 32)[0],
                *struct.unpack_from(end + "HH", head, 54),
            )
        else:
            phoff, phentsize, phnum = (
                struct.unpack_from(end + "I", head, 28)[0],
                *struct.unpack_from(end + "HH", head, 42),
            )
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    for i in range(phnum):
        (p_type,) = struct.unpack_from(end + "I", table, i * phentsize)
        if p_type == 3:  # PT_INTERP
            return False
    return True


@contextlib.contextmanager
def build_lock(path: Path, on_wait: Callable[[], None] = lambda: None) -> Iterator[float]:
    """Serialise builds of one recipe across processes (an flock on ``path``); yields the
    seconds spent waiting for another process's build (``on_wait`` is called when one holds it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        started = time.monotonic()
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            on_wait()
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield time.monotonic() - started
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# --------------------------------------------------------------------------- minimal image


_MINIMAL_DIRS = {
    "bin": 0o755,
    "sbin": 0o755,
    "usr": 0o755,
    "usr/bin": 0o755,
    "usr/sbin": 0o755,
    "etc": 0o755,
    "dev": 0o755,
    "proc": 0o555,
    "sys": 0o555,
    "run": 0o755,
    "var": 0o755,
    "var/tmp": 0o1777,
    "root": 0o700,
    "home": 0o755,
    "tmp": 0o1777,
}


def _busybox_applets(busybox: str) -> list[str]:
    """The applet paths of a static busybox (refused if missing or dynamic)."""
    if not os.path.exists(busybox):
        raise ImageBuildError(
            f"minimal: {busybox} not found; install it with `apt-get install busybox-static`"
        )
    if not _is_static_elf(busybox):
        raise ImageBuildError(
            f"minimal: {busybox} is dynamically linked; install the static build with `apt-get install busybox-static`"
        )
    listing = _run("minimal: busybox --list-full", [busybox, "--list-full"]).stdout.decode()
    return sorted({p.strip().lstrip("/") for p in listing.split() if p.strip()})


class _TarWriter:
    """Entries of a reproducible tar: fixed mtime, numeric owners only."""

    def __init__(self, tar: tarfile.TarFile, mtime: int) -> None:
        self.tar, self.mtime = tar, mtime

    def add(self, name: str, kind: bytes, mode: int, uid: int = 0, gid: int = 0, **kw: Any) -> None:
        info = tarfile.TarInfo(name)
        info.type, info.mode, info.uid, info.gid = kind, mode, uid, gid
        info.uname = info.gname = ""
        info.mtime = self.mtime
        data = kw.pop("data", None)
        for key, value in kw.items():
            setattr(info, key, value)
        if data is None:
            self.tar.addfile(info)
        else:
            info.size = len(data)
            self.tar.addfile(info, io.BytesIO(data))


def minimal_rootfs_tar(busybox: str = BUSYBOX_PATH) -> bytes:
    """The minimal image's root filesystem as an (uncompressed, reproducible) tar."""
    applets = _busybox_applets(busybox)
    with open(busybox, "rb") as f:
        binary = f.read()
    dirs = dict(_MINIMAL_DIRS)
    for applet in applets:  # any other directory an applet lives in
        parent = os.path.dirname(applet)
        while parent and parent not in dirs:
            dirs[parent] = 0o755
            parent = os.path.dirname(parent)
    passwd = (
        "root:x:0:0:root:/root:/bin/sh\n"
        f"{KERNEL_USER}:x:{KERNEL_UID}:{KERNEL_GID}:{KERNEL_USER}:{KERNEL_HOME}:/bin/sh\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
    )
    group = f"root:x:0:\n{KERNEL_USER}:x:{KERNEL_GID}:\nnogroup:x:65534:\n"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        out = _TarWriter(tar, int(os.stat(busybox).st_mtime))
        for d in sorted(dirs):
            out.add(d, tarfile.DIRTYPE, dirs[d])
        out.add(KERNEL_HOME.lstrip("/"), tarfile.DIRTYPE, 0o755, KERNEL_UID, KERNEL_GID)
        out.add("bin/busybox", tarfile.REGTYPE, 0o755, data=binary)
        for applet in applets:
            if applet != "bin/busybox":
                out.add(applet, tarfile.SYMTYPE, 0o777, linkname="/bin/busybox")
        out.add("etc/passwd", tarfile.REGTYPE, 0o644, data=passwd.encode())
        out.add("etc/group", tarfile.REGTYPE, 0o644, data=group.encode())
    return buf.getvalue()


def build_minimal(
    progress: Progress = lambda _msg: None,
    cache_dir: Path | None = None,  # unused: the build is faster than a cache lookup
    force: bool = False,
    client: Any = None,
) -> BuiltImage:
    """Build ``bai-kernel/minimal:1`` from the host's static busybox (~0.1 s)."""
    started = time.monotonic()
    client = _client(client)
    data = minimal_rootfs_tar()
    rootfs = hashlib.sha256(f"minimal-v{RECIPE_VERSION}\0".encode() + data).hexdigest()[:16]
    recipe, changes = _image_config(rootfs, False, "/bin/sh", {"PATH": _PATH})
    if not force and _present_with_recipe(client, MINIMAL_IMAGE, recipe):
        progress(f"minimal: {MINIMAL_IMAGE} already present (recipe {recipe})")
        return _result(client, MINIMAL_IMAGE, recipe, started, "engine")
    _import(client, "minimal: docker import", data, MINIMAL_IMAGE, changes)
    res = _result(client, MINIMAL_IMAGE, recipe, started, "built")
    progress(f"minimal: built {MINIMAL_IMAGE} in {res.seconds:.1f} s ({_mb(res.size_bytes)})")
    return res


# --------------------------------------------------------------------------- python image


def find_apt_mirror(suite: str = PYTHON_SUITE) -> str:
    """The Debian mirror the machine's apt already uses for ``suite`` (sources.list[.d])."""
    entries: list[tuple[str, list[str]]] = []  # (uri, suites)
    paths = ["/etc/apt/sources.list", *sorted(glob.glob("/etc/apt/sources.list.d/*.list"))]
    for path in paths:
        with contextlib.suppress(OSError), open(path) as f:
            for line in f:
                parts = line.split("#", 1)[0].split()
                if len(parts) >= 3 and parts[0] == "deb":
                    rest = parts[1:]
                    if rest[0].startswith("["):  # options: [arch=amd64 signed-by=...]
                        while rest and not rest[0].endswith("]"):
                            rest = rest[1:]
                        rest = rest[1:]
                    if len(rest) >= 2:
                        entries.append((rest[0], [rest[1]]))
    for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
        with contextlib.suppress(OSError), open(path) as f:
            text = f.read()
        for stanza in text.split("\n\n"):
            fields: dict[str, str] = {}
            for line in stanza.splitlines():
                if line.startswith("#") or ":" not in line:
                    continue
                key, _, value = line.partition(":")
                fields[key.strip().lower()] = value.strip()
            if "deb" not in fields.get("types", "").split():
                continue
            if fields.get("enabled", "yes").lower() == "no":
                continue
            for uri in fields.get("uris", "").split():
                entries.append((uri, fields.get("suites", "").split()))
    for uri, suites in entries:
        if suite in suites:
            return uri.rstrip("/")
    raise ImageBuildError(
        f"python: no apt source for suite {suite!r} in /etc/apt/sources.list or "
        "/etc/apt/sources.list.d/; cannot tell which Debian mirror to debootstrap from"
    )


def _dpkg_arch() -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())


@dataclass(frozen=True)
class DebianRoot:
    """What goes into a debootstrap root: packages, then files copied in, then a script run.

    ``files`` maps a directory in the image to a directory of this repository whose files are
    copied there (root-owned, world-readable); ``post_script`` runs in the chroot after them.
    """

    name: str  # the cache tarball's prefix and the progress lines' prefix
    packages: tuple[str, ...]
    files: tuple[tuple[str, Path], ...] = ()
    post_script: str = ""

    def file_digests(self) -> dict[str, str]:
        out = {}
        for target, source in self.files:
            for path in sorted(p for p in source.iterdir() if p.is_file()):
                out[f"{target}/{path.name}"] = hashlib.sha256(path.read_bytes()).hexdigest()
        return out


PYTHON_ROOT = DebianRoot("python", PYTHON_PACKAGES)
SFTP_ROOT = DebianRoot("sftp", SFTP_PACKAGES)
SKLEARN_SERVE_ROOT = DebianRoot(
    "sklearn-serve",
    SKLEARN_SERVE_PACKAGES,
    files=((SKLEARN_SERVE_DIR, SKLEARN_SERVE_FILES),),
    post_script=_SKLEARN_SERVE_SCRIPT,
)


def python_recipe(root: DebianRoot = PYTHON_ROOT) -> dict[str, Any]:
    recipe: dict[str, Any] = {
        "version": RECIPE_VERSION,
        "suite": PYTHON_SUITE,
        "variant": "minbase",
        "arch": _dpkg_arch(),
        "packages": list(root.packages),
        "user": [KERNEL_USER, KERNEL_UID, KERNEL_GID, KERNEL_HOME],
        "script": _PYTHON_SETUP_SCRIPT,
    }
    # Only when present, so that the python image's recipe (and its cached tarball) stays as it was.
    if root.files:
        recipe["files"] = root.file_digests()
    if root.post_script:
        recipe["post_script"] = root.post_script
    return recipe


def python_recipe_hash(root: DebianRoot = PYTHON_ROOT) -> str:
    blob = json.dumps(python_recipe(root), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _mb(n: int) -> str:
    return f"{n / 1e6:.0f} MB"


def _mounts_under(root: Path) -> list[str]:
    prefix = str(root.resolve()).rstrip("/") + "/"
    found = []
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as f:
        for line in f:
            mnt = line.split()[4].replace("\\040", " ")
            if mnt.startswith(prefix) or mnt == prefix.rstrip("/"):
                found.append(mnt)
    return sorted(found, reverse=True)


def _remove_tree(root: Path) -> None:
    for mnt in _mounts_under(root):
        subprocess.run(["umount", "-l", mnt], capture_output=True)
    if _mounts_under(root):
        raise ImageBuildError(f"python: {root} still has mounts under it; not removing it")
    subprocess.run(["rm", "-rf", "--one-file-system", str(root)], capture_output=True)


def _check_python_build_tools(tarball: Path) -> None:
    if shutil.which("debootstrap") is None:
        raise ImageBuildError(
            "python: debootstrap is not installed; install it with `apt-get install debootstrap`"
        )
    if os.geteuid() != 0:
        raise ImageBuildError(
            "python: building the root filesystem needs root (debootstrap, chroot); run the build "
            f"as root once, or place a built tarball at {tarball}"
        )


def _debootstrap(progress: Progress, root: Path, mirror: str, name: str = "python") -> None:
    t0 = time.monotonic()
    progress(
        f"{name}: debootstrap {PYTHON_SUITE} from {mirror} (this takes ~40 s the first time)\N{HORIZONTAL ELLIPSIS}"
    )
    command = ["debootstrap", "--variant=minbase", f"--arch={_dpkg_arch()}", PYTHON_SUITE]
    _run(f"{name}: debootstrap", [*command, str(root), mirror])
    progress(f"{name}: debootstrap done in {time.monotonic() - t0:.0f} s")


def _install_python_packages(
    progress: Progress, root: Path, spec: DebianRoot = PYTHON_ROOT
) -> None:
    """The packages and the kernel user, in the chroot; nothing is started (policy-rc.d).

    Then ``spec``'s files are copied in and its post script runs in the chroot.
    """
    t0 = time.monotonic()
    progress(
        f"{spec.name}: installing {' '.join(spec.packages)} in the chroot\N{HORIZONTAL ELLIPSIS}"
    )
    policy = root / "usr/sbin/policy-rc.d"
    policy.write_text("#!/bin/sh\nexit 101\n")
    policy.chmod(0o755)
    with contextlib.suppress(OSError):
        shutil.copyfile("/etc/resolv.conf", root / "etc/resolv.conf")
    script = _PYTHON_SETUP_SCRIPT.format(
        packages=" ".join(spec.packages),
        uid=KERNEL_UID,
        gid=KERNEL_GID,
        user=KERNEL_USER,
        home=KERNEL_HOME,
    )
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": "/root"}
    _run(f"{spec.name}: chroot setup", ["chroot", str(root), "/bin/sh", "-c", script], env=env)
    progress(f"{spec.name}: packages installed in {time.monotonic() - t0:.0f} s")
    for target, source in spec.files:
        dest = root / target.lstrip("/")
        dest.mkdir(parents=True, exist_ok=True)
        dest.chmod(0o755)
        for path in sorted(p for p in source.iterdir() if p.is_file()):
            shutil.copyfile(path, dest / path.name)
            (dest / path.name).chmod(0o644)
    if spec.post_script:
        t0 = time.monotonic()
        cmd = ["chroot", str(root), "/bin/sh", "-c", spec.post_script]
        out = _run(f"{spec.name}: post-install script", cmd, env=env).stdout
        progress(
            f"{spec.name}: {_tail(out, 3) or 'post-install script done'} ({time.monotonic() - t0:.0f} s)"
        )


def _tar_root(root: Path, tmp_tar: Path) -> None:
    """The root as a tar without xattrs (file capabilities break binaries under cap-drop ALL)."""
    flags = ["--numeric-owner", "--no-xattrs", "--no-acls", "--no-selinux"]
    excludes = ["--exclude=./dev/*", "--exclude=./proc/*", "--exclude=./sys/*"]
    _run(
        "python: tar root filesystem",
        ["tar", *flags, *excludes, "-C", str(root), "-cf", str(tmp_tar), "."],
    )
    with open(tmp_tar, "rb") as f:
        os.fsync(f.fileno())


def _build_python_tarball(
    progress: Progress, tarball: Path, recipe: str, spec: DebianRoot = PYTHON_ROOT
) -> None:
    """debootstrap + chroot setup + tar, written atomically to ``tarball``."""
    _check_python_build_tools(tarball)
    mirror = find_apt_mirror(PYTHON_SUITE)
    cache = tarball.parent
    # Left by an interrupted build (we hold the lock).
    for stale in cache.glob(f".build-{recipe}-*"):
        _remove_tree(stale)
    for stale_tar in cache.glob(f".{tarball.name}.*.tmp"):
        stale_tar.unlink(missing_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=f".build-{recipe}-", dir=cache))
    root = workdir / "root"
    tmp_tar = cache / f".{tarball.name}.{os.getpid()}.tmp"
    try:
        _debootstrap(progress, root, mirror, spec.name)
        _install_python_packages(progress, root, spec)
        t0 = time.monotonic()
        _tar_root(root, tmp_tar)
        os.replace(tmp_tar, tarball)
        meta = dict(python_recipe(spec), mirror=mirror, built_at=time.time())
        tarball.with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n")
        progress(
            f"{spec.name}: root tarball {_mb(tarball.stat().st_size)} cached at {tarball} ({time.monotonic() - t0:.0f} s)"
        )
    finally:
        with contextlib.suppress(OSError):
            tmp_tar.unlink()
        _remove_tree(workdir)


def python_tarball_path(cache_dir: Path | None = None, spec: DebianRoot = PYTHON_ROOT) -> Path:
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return cache / f"{spec.name}-{PYTHON_SUITE}-{python_recipe_hash(spec)}.tar"


def build_python(
    progress: Progress = lambda _msg: None,
    cache_dir: Path | None = None,
    force: bool = False,
    client: Any = None,
) -> BuiltImage:
    """Build ``bai-kernel/python:2``: engine hit -> nothing; cache hit -> import; else debootstrap.

    ``force`` rebuilds the root filesystem from scratch and replaces the cached tarball.
    """
    return _build_debian_image(
        progress, cache_dir, force, client, reference=PYTHON_IMAGE, spec=PYTHON_ROOT
    )


def build_sftp(
    progress: Progress = lambda _msg: None,
    cache_dir: Path | None = None,
    force: bool = False,
    client: Any = None,
) -> BuiltImage:
    """Build ``bai-kernel/sftp:2`` (python3, python3-asyncssh, openssh-server), cached alike."""
    return _build_debian_image(
        progress, cache_dir, force, client, reference=SFTP_IMAGE, spec=SFTP_ROOT, supports_ssh=False
    )


def build_sklearn_serve(
    progress: Progress = lambda _msg: None,
    cache_dir: Path | None = None,
    force: bool = False,
    client: Any = None,
) -> BuiltImage:
    """Build ``bai-kernel/sklearn-serve:1`` (the iris model server), cached like the python image."""
    return _build_debian_image(
        progress,
        cache_dir,
        force,
        client,
        reference=SKLEARN_SERVE_IMAGE,
        spec=SKLEARN_SERVE_ROOT,
        supports_ssh=False,
    )


def _build_debian_image(
    progress: Progress,
    cache_dir: Path | None,
    force: bool,
    client: Any,
    *,
    reference: str,
    spec: DebianRoot,
    supports_ssh: bool = True,
) -> BuiltImage:
    """A debootstrap image: engine hit -> nothing; cache hit -> import; else build the root."""
    started = time.monotonic()
    client = _client(client)
    name, rootfs = spec.name, python_recipe_hash(spec)
    recipe, changes = _image_config(
        rootfs, supports_ssh, "/bin/bash", {"PATH": _PATH, "LANG": "C.UTF-8"}
    )
    tarball = python_tarball_path(cache_dir, spec)
    if not force and _present_with_recipe(client, reference, recipe):
        progress(f"{name}: {reference} already present (recipe {recipe})")
        return _result(client, reference, recipe, started, "engine")

    def waiting() -> None:
        progress(f"{name}: another process is building {reference}; waiting for it")

    with build_lock(tarball.with_suffix(".lock"), waiting) as waited:
        # Another process may have finished the same build while we waited for the lock.
        if not force and _present_with_recipe(client, reference, recipe):
            if waited < LOCK_WAIT_NOTICE:
                progress(f"{name}: {reference} already present (recipe {recipe})")
                return _result(client, reference, recipe, started, "engine")
            progress(
                f"{name}: waited {waited:.1f} s for another process's build; "
                f"{reference} is present now (recipe {recipe})"
            )
            return _result(client, reference, recipe, started, "waited")
        source = "cache"
        if force or not tarball.is_file():
            _build_python_tarball(progress, tarball, rootfs, spec)
            source = "built"
        else:
            progress(f"{name}: cached at {tarball}, importing")
        _import(client, f"{name}: docker import", str(tarball), reference, changes)
    res = _result(client, reference, recipe, started, source)
    how = "built" if source == "built" else "imported from cache"
    progress(f"{name}: {how} {reference} in {res.seconds:.1f} s ({_mb(res.size_bytes)})")
    return res


def build_all(
    progress: Progress = lambda _msg: None,
    cache_dir: Path | None = None,
    force: bool = False,
    client: Any = None,
) -> list[BuiltImage]:
    """Build (or reuse) every kernel image the project ships; minimal first (it is instant)."""
    client = _client(client)
    return [
        build_minimal(progress, cache_dir, force, client),
        build_python(progress, cache_dir, force, client),
        build_sftp(progress, cache_dir, force, client),
        build_sklearn_serve(progress, cache_dir, force, client),
    ]


if __name__ == "__main__":  # python -m sessions_app.kernel_images [--force]
    import sys

    for built in build_all(lambda m: print(m, flush=True), force="--force" in sys.argv):
        print(built)
