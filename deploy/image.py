"""The Shoal image of ``shoal cluster build``: the build context, an offline wheelhouse and
``docker build`` of deploy/Dockerfile (docs/deploy.md), plus the harness's docker client and
error. Needs the ``docker`` package (``pip install 'shoal[deploy]'``) only when called.
"""
from __future__ import annotations

import io
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

from shoal.shared.errors import ShoalError

DEFAULT_IMAGE = "shoal:latest"
#: Files of the repository that the image build needs (the build context).
CONTEXT_PATHS = ("pyproject.toml", "README.md", "shared", "router", "node", "cli", "pipeline",
                 "deploy")
#: Installed in the image next to the project's dependencies (the load generator's client).
EXTRA_WHEELS = ("pika>=1.3",)
#: Needed to build the project itself offline (pyproject's [build-system]).
BUILD_WHEELS = ("setuptools>=68", "wheel")


class ClusterError(ShoalError):
    """A docker cluster operation failed. ``str(err)`` is one line."""


class Interrupted(ClusterError):
    """SIGINT or SIGTERM arrived while a command ran; what it started has been removed."""


def docker_client() -> Any:
    """``docker.from_env()``, pinged. Raises ClusterError when the SDK or the engine is missing."""
    try:
        import docker
    except ImportError:
        raise ClusterError("shoal cluster needs the docker package: "
                           "pip install 'shoal[deploy]'") from None
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        raise ClusterError(f"no Docker engine reachable: {exc}") from None
    return client


def repo_root() -> Path:
    """The source tree holding deploy/Dockerfile: the current directory or this package's."""
    for cand in (Path.cwd(), Path(__file__).resolve().parents[1]):
        if (cand / "deploy" / "Dockerfile").is_file() and (cand / "pyproject.toml").is_file():
            return cand
    raise ClusterError("cannot find deploy/Dockerfile: run from the Shoal source tree")


def _image_python(client: Any, base_image: str) -> tuple[str, str, str]:
    """``(major.minor, machine, glibc version)`` of ``python3`` in ``base_image``."""
    import docker
    code = ("import sys,platform;v=sys.version_info;"
            "print(f'{v[0]}.{v[1]}',platform.machine(),platform.libc_ver()[1] or '2.17')")
    try:
        out = client.containers.run(base_image, ["python3", "-c", code], remove=True,
                                    network_mode="none", entrypoint=[])
    except docker.errors.DockerException as exc:  # ImageNotFound, ContainerError, APIError
        raise ClusterError(f"cannot run python3 in base image {base_image}: "
                           f"{str(exc).splitlines()[0]}") from None
    version, machine, glibc = out.decode().split()
    return version, machine, glibc


def project_requirements(root: Path) -> list[str]:
    """The image's requirements: pyproject dependencies (+ a ``loadtest`` extra if defined)."""
    import tomllib
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    return [*project["dependencies"],
            *project.get("optional-dependencies", {}).get("loadtest", []), *EXTRA_WHEELS]


def fill_wheelhouse(root: Path, python: str, machine: str, glibc: str) -> Path:
    """Download every wheel the image needs for that Python/platform into deploy/wheelhouse.

    Uses ``pip download --only-binary=:all:`` (so it works for another Python than this one);
    raises ClusterError with pip's last line when a wheel cannot be had.
    """
    wh = root / "deploy" / "wheelhouse"
    wh.mkdir(parents=True, exist_ok=True)
    major, minor = glibc.split(".")[:2]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
           "-d", str(wh), "--only-binary=:all:", "--python-version", python,
           "--implementation", "cp", "--platform", f"manylinux_{major}_{minor}_{machine}",
           "--platform", f"manylinux2014_{machine}", *BUILD_WHEELS, *project_requirements(root)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ClusterError(f"pip download for the wheelhouse failed: {last}")
    return wh


def build_context(root: Path) -> io.BytesIO:
    """An uncompressed tar of CONTEXT_PATHS (no caches), for ``docker build``."""
    buf = io.BytesIO()

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        parts = info.name.split("/")
        return None if "__pycache__" in parts or info.name.endswith(".pyc") else info
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for rel in CONTEXT_PATHS:
            if (root / rel).exists():
                tar.add(root / rel, arcname=rel, filter=keep)
    buf.seek(0)
    return buf


def build_image(client: Any, base_image: str = "python:3.12-slim", tag: str = DEFAULT_IMAGE,
                root: Path | None = None, offline: bool = True) -> str:
    """Build deploy/Dockerfile on ``base_image`` as ``tag``; return the image id.

    ``offline``: fill the wheelhouse on the host first and build with no network at all
    (``network_mode="none"``), which proves the image builds offline. Raises ClusterError with
    the failing build step's last log line.
    """
    import docker
    root = root or repo_root()
    if offline:
        fill_wheelhouse(root, *_image_python(client, base_image))
    try:
        previous = client.images.get(tag).id
    except docker.errors.ImageNotFound:
        previous = None
    try:
        image, _ = client.images.build(
            fileobj=build_context(root), custom_context=True, dockerfile="deploy/Dockerfile",
            tag=tag, buildargs={"BASE_IMAGE": base_image}, rm=True, forcerm=True,
            network_mode="none" if offline else "host")
    except docker.errors.BuildError as exc:
        lines = [c.get("stream", c.get("error", "")).strip() for c in exc.build_log]
        tail = [ln for ln in lines if ln][-1:] or [str(exc)]
        raise ClusterError(f"image build failed: {tail[0]}") from None
    if previous and previous != image.id:          # don't pile up old images of this tag
        try:
            client.images.remove(previous)
        except docker.errors.APIError:              # still used by a container: keep it
            pass
    return image.id
