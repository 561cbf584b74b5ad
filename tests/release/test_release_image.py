"""The container image, assembled the way deploy/container/Containerfile builds it and
run the way a container runtime runs it — without a container runtime, which cannot
start a container on every machine (docs/install.md says what this proves).

The image's root is a directory: the base image is this machine's own Debian system
(``/usr`` and ``/etc`` bind-mounted read-only, in a mount namespace of the test's own
that vanishes with its processes), the runtime stage's steps are replayed into it
(the venv at ``/opt/troth`` with the wheel, the volume directory owned by the
image's user), and ``troth serve`` is started by ``chroot`` as that user, with the
image's environment, working directory, entrypoint and command read from the
Containerfile, so that a change to those lines is tested. The health check is the
Containerfile's own command, run the same way; SIGTERM stops the server as
``podman stop`` would."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from helpers.install import ROOT, call, clean_env, run
from helpers.serve_process import started
from helpers.support import free_port
from troth.version import health, schema_version

CONTAINERFILE = ROOT / "deploy" / "container" / "Containerfile"

#: The PATH of the Debian base image, which the Containerfile's ``$PATH`` extends.
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

#: Mount the base system into the root read-only, then chroot: ``sh -c ENTER root …``.
ENTER = """set -e
root=$1; shift
for d in usr etc; do mount --bind -o ro "/$d" "$root/$d"; done
mount --rbind /dev "$root/dev"
mount -t proc proc "$root/proc"
exec chroot "$@"
"""

pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("chroot") is None,
        reason="assembling the image's root needs root, unshare and chroot (util-linux, "
        "coreutils): run the tests as root",
    ),
    pytest.mark.skipif(
        not Path("/etc/debian_version").exists()
        or not Path("/usr/bin/python3").exists()
        or subprocess.run(["/usr/bin/python3", "-c", "import ensurepip, venv"]).returncode != 0,
        reason="the image's base is Debian with python3 and python3-venv; as its stand-in "
        "this machine needs both (apt-get install python3 python3-venv)",
    ),
]


@dataclass
class Runtime:
    """The runtime stage's instructions, as a runtime applies them."""

    env: dict[str, str] = field(default_factory=dict)
    user: str = ""
    workdir: str = "/"
    volumes: list[str] = field(default_factory=list)
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    healthcheck: list[str] = field(default_factory=list)
    stopsignal: str = "SIGTERM"


def runtime_stage(text: str) -> Runtime:
    """The instructions after the last ``FROM``, continuation lines joined."""
    lines = text.replace("\\\n", " ").splitlines()
    last_from = max(i for i, line in enumerate(lines) if line.startswith("FROM "))
    stage = Runtime()
    for line in lines[last_from + 1 :]:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        word, _, rest = line.strip().partition(" ")
        if word == "ENV":
            for pair in shlex.split(rest):
                key, _, value = pair.partition("=")
                stage.env[key] = value.replace("$PATH", stage.env.get("PATH", BASE_PATH))
        elif word == "USER":
            stage.user = rest.strip()
        elif word == "WORKDIR":
            stage.workdir = rest.strip()
        elif word == "VOLUME":
            stage.volumes = json.loads(rest)
        elif word == "ENTRYPOINT":
            stage.entrypoint = json.loads(rest)
        elif word == "CMD":
            stage.cmd = json.loads(rest)
        elif word == "STOPSIGNAL":
            stage.stopsignal = rest.strip()
        elif word == "HEALTHCHECK":
            stage.healthcheck = json.loads(rest[rest.index("CMD ") + 4 :])
    return stage


def in_root(root: Path, user: str, env: dict[str, str], argv: list[str], cwd: str) -> list[str]:
    """The command that runs ``argv`` in the image's root as ``user``, with ``env``
    only and ``cwd`` as working directory, as a container's process starts."""
    pairs = [f"{k}={v}" for k, v in env.items()]
    chroot = ["--userspec", user, str(root), "/usr/bin/env", "-i", "-C", cwd, *pairs, *argv]
    enter = ["/bin/sh", "-c", ENTER, "enter", str(root)]
    return ["unshare", "--mount", "--propagation", "private", "--", *enter, *chroot]


@pytest.fixture(scope="module")
def image(wheel: Path, release_dir: Path) -> tuple[Path, Runtime]:
    """The image's root with the runtime stage's steps replayed into it."""
    stage = runtime_stage(CONTAINERFILE.read_text())
    root = release_dir / "image"
    for d in ("usr", "etc", "dev", "proc", "opt", "var/lib"):
        (root / d).mkdir(parents=True)
    for link in ("bin", "lib", "lib64", "sbin"):  # Debian's merged /usr
        (root / link).symlink_to(f"usr/{link}")
    (root / "tmp").mkdir(mode=0o1777)
    (root / "tmp").chmod(0o1777)
    # COPY --from=build /dist/ /tmp/dist/, with the wheels of the dependencies beside it:
    # the chroot sees no index, so pip installs from that directory alone.
    dist = root / "tmp" / "dist"
    dist.mkdir()
    shutil.copy2(wheel, dist)
    run(
        [sys.executable, "-m", "pip", "wheel", "-q", "-w", str(dist), str(wheel)],
        timeout=480,
        env=clean_env(),
    )
    # RUN python3 -m venv /opt/troth && /opt/troth/bin/pip install … /tmp/dist/*.whl
    build_env = {"PATH": BASE_PATH, "PIP_CONFIG_FILE": "/dev/null", "HOME": "/tmp"}
    pip = ["/opt/troth/bin/pip", "install", "-q", "--no-cache-dir", "--no-index"]
    steps = [
        ["python3", "-m", "venv", "/opt/troth"],
        [*pip, "--find-links", "/tmp/dist", "troth"],
    ]
    for argv in steps:
        run(in_root(root, "0:0", build_env, argv, "/"), timeout=300)
    shutil.rmtree(dist)
    # RUN useradd … && mkdir -p /var/lib/troth && chown 10001:10001 /var/lib/troth
    uid, gid = (int(n) for n in stage.user.split(":"))
    for volume in stage.volumes:
        (root / volume.lstrip("/")).mkdir(parents=True, exist_ok=True)
        os.chown(root / volume.lstrip("/"), uid, gid)
    return root, stage


def test_the_image_runs_troth_as_its_user_with_the_database_on_the_volume(
    image: tuple[Path, Runtime], tmp_path: Path
) -> None:
    root, stage = image
    assert stage.user and not stage.user.startswith(("0:", "root")), "the image runs as root"
    uid = int(stage.user.split(":")[0])
    assert stage.stopsignal == "SIGTERM"
    assert (root / "opt/troth").stat().st_uid == 0  # the code is not its user's to change
    port = free_port()
    env = {**stage.env, "TROTH_PORT": str(port)}  # podman run -e TROTH_PORT=…
    url = f"http://127.0.0.1:{port}"

    def check() -> int:
        argv = in_root(root, stage.user, env, stage.healthcheck, stage.workdir)
        return subprocess.run(argv, capture_output=True, timeout=30).returncode

    assert check() != 0  # nothing serves yet: the health check can fail
    log = tmp_path / "container.log"
    cmd = in_root(root, stage.user, env, stage.entrypoint + stage.cmd, stage.workdir)
    with started(cmd, url, log) as proc:
        status = Path(f"/proc/{proc.pid}/status").read_text()
        assert f"\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n" in status
        assert check() == 0
        assert httpx.get(f"{url}/health", timeout=5).json() == health()
        assert httpx.get(f"{url}/ui/", timeout=5).status_code == 200
        assert call(url, "promise.create", {"id": "boxed", "timeoutAt": 10**13}).status_code == 200
        proc.send_signal(signal.SIGTERM)  # podman stop
        assert proc.wait(20) in (0, -signal.SIGTERM), log.read_text()
    text = log.read_text()
    assert "Application shutdown complete" in text and "Traceback" not in text
    [volume] = stage.volumes
    db = root / volume.lstrip("/") / "troth.db"
    assert stage.env["TROTH_DB"] == f"{volume}/troth.db"
    assert db.stat().st_uid == uid
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT max(version) FROM schema_version").fetchone()[0] == (
            schema_version()
        )
        assert conn.execute("SELECT id FROM promises").fetchall() == [("boxed",)]
