"""Environments and process plumbing for the real-SDK end-to-end tests.

The published SDKs cannot run in troth's own venv: ``resonate-sdk`` 0.8.1 needs
Python >= 3.12 (on 3.11 pip only offers the legacy 0.4.x) and ``@resonatehq/sdk``
0.11.5 is a Node package.  So each gets an environment of its own, built on first
use and cached under ``.sdk-cache/`` keyed by version, so that a developer's rerun
costs nothing and a fresh CI machine builds what it needs (~10 s) by itself.

A missing interpreter or Node is a test *failure*, never a skip: the machines the
project runs on have them, and a silently skipped interoperability test would hide
exactly the regressions these tests exist for.

The second half runs the programs: every subprocess writes its stdout and stderr
to files under the test's ``tmp_path``, is killed in teardown, and has its logs
printed at teardown (pytest shows them only for a failed test), so a CI log tells
what the server and every SDK process did.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SDK_PROGRAMS = REPO / "tests" / "sdk"
#: The example programs live in shared/ beside the repository (as the conformance
#: corpus does); tests/sdk/ holds only troth's own drivers and the polyfill.
SHARED_EXAMPLES = REPO.parent / "shared" / "sdk-examples"


#: What shared/sdk-examples' client programs print, line by line (their last line,
#: the elapsed time, varies).
EXAMPLE_PY = [
    "workflow   -> hello world!",
    "fanout     -> [0, 1, 4, 9, 16, 25, 36, 49, 64, 81]",
    "rpc_fanout -> 285",
    "rpc        -> 49",
    "workflow (same id again) -> hello world!",
]
EXAMPLE_TS = [
    "workflow   -> hello world!",
    "fanout     -> [0,1,4,9,16,25,36,49,64,81]",
    "rpc_fanout -> 285",
    "rpc        -> 49",
]


def program_path(name: str) -> Path:
    """Where program ``name`` lives: troth's own drivers first, then shared/."""
    own = SDK_PROGRAMS / name
    if own.exists():
        return own
    shared = SHARED_EXAMPLES / name
    if not shared.exists():
        fail(f"{shared} is missing: the SDK examples come from shared/sdk-examples/")
    return shared


#: Where built environments live; ``TROTH_SDK_CACHE`` moves it (e.g. to a CI cache).
CACHE = Path(os.environ.get("TROTH_SDK_CACHE", REPO / ".sdk-cache"))

PY_SDK_VERSION = "0.8.1"
TS_SDK_VERSION = "0.11.5"
#: ``node --import`` (used for the polyfill) exists from 20.6; the SDK runs on 20.
MIN_NODE = (20, 6)
BUILD_TIMEOUT = 600.0


def fail(message: str) -> None:
    """Fail (not skip) the requesting test with a message meant for a human."""
    pytest.fail(message, pytrace=False)


# --------------------------------------------------------------------------- #
# Building the environments
# --------------------------------------------------------------------------- #
def _prepare_cache() -> None:
    """Create the cache dir, ignored by git from the inside.

    A ``.gitignore`` of ``*`` inside the cache keeps ``git add -A`` from picking
    up venvs and node_modules without touching the project's own .gitignore.
    """
    CACHE.mkdir(parents=True, exist_ok=True)
    ignore = CACHE / ".gitignore"
    if not ignore.exists():
        ignore.write_text("*\n")


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    """Serialise builds of one environment across concurrent pytest processes."""
    _prepare_cache()
    with open(CACHE / f"{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _run_build_step(argv: list[str], cwd: Path, log: Path, what: str) -> None:
    """Run one build command, appending its output to ``log``; fail with the tail."""
    with open(log, "ab") as out:
        out.write(f"\n$ {' '.join(argv)}\n".encode())
        out.flush()
        try:
            rc = subprocess.run(
                argv,
                cwd=cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=BUILD_TIMEOUT,
                check=False,
            ).returncode
        except (OSError, subprocess.TimeoutExpired) as exc:
            fail(f"{what}: {exc}\n(log: {log})\n{_tail(log, 40)}")
    if rc != 0:
        fail(f"{what} failed with exit code {rc} (log: {log})\n{_tail(log, 40)}")


def _build_once(name: str, marker_data: dict[str, str], build: Callable[[Path], None]) -> Path:
    """Return ``CACHE/name``, building it first unless a finished build is there.

    The marker file is written last, so a build interrupted half-way (CI timeout,
    Ctrl-C) is thrown away and redone instead of being trusted.
    """
    target = CACHE / name
    marker = target / ".troth-complete"
    with _locked(name):
        if marker.exists() and json.loads(marker.read_text()) == marker_data:
            return target
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        build(target)
        marker.write_text(json.dumps(marker_data))
    return target


def find_python312() -> Path:
    """The machine's CPython 3.12 (pyenv's on the project machines).

    ``TROTH_SDK_PYTHON`` overrides; otherwise the newest 3.12.x under pyenv's
    root (``pyenv root`` if pyenv is on PATH, else ``~/.pyenv``), else a
    ``python3.12`` on PATH.
    """
    override = os.environ.get("TROTH_SDK_PYTHON")
    if override:
        if not Path(override).exists():
            fail(f"TROTH_SDK_PYTHON={override} does not exist")
        return Path(override)
    roots = {Path.home() / ".pyenv"}
    if env_root := os.environ.get("PYENV_ROOT"):
        roots.add(Path(env_root))
    if pyenv := shutil.which("pyenv"):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                [pyenv, "root"], capture_output=True, text=True, timeout=30, check=False
            )
            if out.returncode == 0 and out.stdout.strip():
                roots.add(Path(out.stdout.strip()))
    found: list[Path] = []
    for root in roots:
        found += [
            Path(p) for p in glob.glob(str(root / "versions" / "3.12*" / "bin" / "python3.12"))
        ]

    def version_key(p: Path) -> tuple[int, ...]:
        digits = re.findall(r"\d+", p.parents[1].name)
        return tuple(int(d) for d in digits)

    if found:
        return max(found, key=version_key)
    if on_path := shutil.which("python3.12"):
        return Path(on_path)
    fail(
        "the real-SDK tests need CPython 3.12 (resonate-sdk 0.8.1 requires >= 3.12) "
        f"but none was found under {sorted(str(r) for r in roots)}/versions/3.12*/bin "
        "or as python3.12 on PATH; install one (e.g. `pyenv install 3.12`) "
        "or set TROTH_SDK_PYTHON"
    )
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class PythonSdk:
    """A venv holding ``resonate-sdk``; ``python`` runs the SDK programs."""

    python: Path
    version: str

    def program(self, name: str, *args: str) -> list[str]:
        """The argv that runs ``tests/sdk/<name>`` with this SDK."""
        return [str(self.python), str(program_path(name)), *args]


#: The SDKs' NATS connector (docs/operations.md, "NATS"), installed beside
#: ``resonate-sdk`` for the NATS tests, with the nats-py it works with: nats-py
#: 2.16.0 validates header names on publish and refuses the connector's
#: ``resonate:origin`` header (a colon is not a header-name character), so every
#: request fails with ``nats: invalid header``; 2.15.0 sends it. troth never reads
#: that header (it takes the origin from the subject).
NATS_CONNECTOR = ("resonate-nats==0.8.0", "nats-py==2.15.0")


def build_python_sdk(extra: tuple[str, ...] = ()) -> PythonSdk:
    """Find Python 3.12 and (once) build a venv with ``resonate-sdk`` in the cache,
    plus the pinned requirements ``extra`` (e.g. :data:`NATS_CONNECTOR`)."""
    base = find_python312()
    probe = subprocess.run(
        [str(base), "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if probe.returncode != 0:
        fail(f"{base} does not run: {probe.stderr.strip()}")
    py_version = probe.stdout.strip()
    name = f"py{py_version}-resonate-sdk-{PY_SDK_VERSION}"
    if extra:
        name += "-" + "-".join(e.replace("==", "-") for e in extra)

    def build(target: Path) -> None:
        log = target / "build.log"
        _run_build_step([str(base), "-m", "venv", str(target / "venv")], target, log, "venv")
        pip = [str(target / "venv" / "bin" / "python"), "-m", "pip"]
        _run_build_step(
            [
                *pip,
                "install",
                "--disable-pip-version-check",
                "--no-input",
                f"resonate-sdk=={PY_SDK_VERSION}",
                *extra,
            ],
            target,
            log,
            f"pip install resonate-sdk=={PY_SDK_VERSION} {' '.join(extra)}",
        )
        _run_build_step(
            [str(target / "venv" / "bin" / "python"), "-c", "import resonate.resonate"],
            target,
            log,
            "import resonate",
        )

    marker = {"python": str(base), "python_version": py_version, "sdk": PY_SDK_VERSION}
    if extra:
        marker["extra"] = " ".join(extra)
    target = _build_once(name, marker, build)
    return PythonSdk(python=target / "venv" / "bin" / "python", version=py_version)


@dataclass(frozen=True)
class NodeSdk:
    """An npm prefix holding ``@resonatehq/sdk`` plus the Node that runs it."""

    node: Path
    root: Path
    version: str

    def program(self, name: str, *args: str) -> list[str]:
        """The argv that runs ``tests/sdk/<name>`` with this SDK.

        ESM resolves bare imports from the *script's* directory upwards (NODE_PATH
        does not apply), so the program is copied next to the cached node_modules
        first.  The Promise.withResolvers polyfill is preloaded with ``--import``.
        """
        programs = self.root / "programs"
        programs.mkdir(exist_ok=True)
        script = programs / name
        source = program_path(name).read_bytes()
        if not script.exists() or script.read_bytes() != source:
            # write-then-rename: a concurrent run never sees a half-written file
            partial = programs / f".{name}.{os.getpid()}"
            partial.write_bytes(source)
            os.replace(partial, script)
        polyfill = (SDK_PROGRAMS / "withresolvers.mjs").as_uri()
        return [str(self.node), "--import", polyfill, str(script), *args]


def build_node_sdk() -> NodeSdk:
    """Check Node (>= 20.6) and npm, and (once) ``npm install`` the SDK in the cache."""
    node = shutil.which("node")
    npm = shutil.which("npm")
    if node is None or npm is None:
        fail(
            f"the real-SDK tests need Node >= {MIN_NODE[0]}.{MIN_NODE[1]} and npm on PATH "
            f"(node={node}, npm={npm}); install them (e.g. `apt-get install nodejs npm`)"
        )
        raise AssertionError("unreachable")
    out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=60)
    match = re.match(r"v(\d+)\.(\d+)", out.stdout.strip())
    if out.returncode != 0 or match is None:
        fail(f"`{node} --version` failed: {out.stdout!r} {out.stderr!r}")
        raise AssertionError("unreachable")
    version = (int(match[1]), int(match[2]))
    if version < MIN_NODE:
        fail(f"Node {out.stdout.strip()} is too old: the TS SDK tests need >= 20.6")

    def build(target: Path) -> None:
        (target / "package.json").write_text(
            json.dumps({"name": "troth-sdk-e2e", "private": True}) + "\n"
        )
        _run_build_step(
            [
                npm,
                "install",
                "--no-audit",
                "--no-fund",
                "--loglevel=error",
                f"@resonatehq/sdk@{TS_SDK_VERSION}",
            ],
            target,
            target / "build.log",
            f"npm install @resonatehq/sdk@{TS_SDK_VERSION}",
        )
        installed = target / "node_modules" / "@resonatehq" / "sdk" / "package.json"
        got = json.loads(installed.read_text())["version"] if installed.exists() else None
        if got != TS_SDK_VERSION:
            fail(f"npm installed @resonatehq/sdk {got}, wanted {TS_SDK_VERSION}")

    target = _build_once(f"ts-resonate-sdk-{TS_SDK_VERSION}", {"sdk": TS_SDK_VERSION}, build)
    return NodeSdk(node=Path(node), root=target, version=out.stdout.strip())


# --------------------------------------------------------------------------- #
# Subprocesses with their logs in files
# --------------------------------------------------------------------------- #
def _tail(path: Path, lines: int) -> str:
    if not path.exists():
        return "(no file)"
    text = path.read_text(errors="replace").splitlines()
    cut = len(text) - lines
    head = [f"... ({cut} earlier lines in {path})"] if cut > 0 else []
    return "\n".join(head + text[-lines:])


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a child: ours minus anything that would redirect it.

    ``RESONATE_*`` would point an SDK elsewhere and ``TROTH_*`` would reconfigure
    the server, so neither leaks in from the developer's shell.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RESONATE_", "TROTH_"))}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


@dataclass
class Proc:
    """One child process; its stdout and stderr are files under the test's tmp dir."""

    name: str
    argv: list[str]
    popen: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path
    started: float = field(default_factory=time.monotonic)

    def out(self) -> str:
        return self.stdout.read_text(errors="replace")

    def err(self) -> str:
        return self.stderr.read_text(errors="replace")

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        """SIGKILL: no shutdown hook runs, as if the machine had died."""
        if self.alive():
            self.popen.send_signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(10)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not go within 5 s."""
        if self.alive():
            self.popen.terminate()
            try:
                self.popen.wait(5)
            except subprocess.TimeoutExpired:
                self.kill()

    def report(self, lines: int = 120) -> str:
        rc = self.popen.poll()
        state = "running" if rc is None else f"exit {rc}"
        return (
            f"===== {self.name} ({state}): {' '.join(self.argv)}\n"
            f"----- stdout\n{_tail(self.stdout, lines)}\n"
            f"----- stderr\n{_tail(self.stderr, lines)}"
        )


class Procs:
    """Starts children for one test, waits on their output, and cleans up after."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.logs = workdir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.all: list[Proc] = []
        #: Checks run while waiting; one returning a message fails the test at once
        #: (e.g. the server died), instead of after the full timeout.
        self.sentinels: list[Callable[[], str | None]] = []

    def start(
        self, name: str, argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> Proc:
        if any(p.name == name for p in self.all):
            raise ValueError(f"duplicate process name {name}")
        stdout, stderr = self.logs / f"{name}.out", self.logs / f"{name}.err"
        with open(stdout, "wb") as out, open(stderr, "wb") as err:
            popen = subprocess.Popen(
                argv,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                cwd=cwd or self.workdir,
                env=child_env(env),
            )
        proc = Proc(name, argv, popen, stdout, stderr)
        self.all.append(proc)
        return proc

    def report(self) -> str:
        """The tail of every process's stdout and stderr, for a failure report."""
        return "\n".join(p.report() for p in self.all)

    def fail(self, message: str) -> None:
        """Fail the test; the logs follow once, from the fixture's teardown."""
        fail(
            f"{message}\n(the logs of every process are in the teardown output; files: {self.logs})"
        )

    def wait_for(self, what: str, check: Callable[[], bool], timeout: float) -> None:
        """Poll ``check`` until it holds; fail with every process's log if it never does."""
        deadline = time.monotonic() + timeout
        next_sentinel = 0.0
        while not check():
            now = time.monotonic()
            if now > deadline:
                self.fail(f"timed out after {timeout:.0f} s waiting for {what}")
            if now >= next_sentinel:
                next_sentinel = now + 0.5
                for sentinel in self.sentinels:
                    if (problem := sentinel()) is not None:
                        self.fail(f"while waiting for {what}: {problem}")
            time.sleep(0.05)

    def wait_line(self, proc: Proc, pattern: str, timeout: float, count: int = 1) -> list[str]:
        """Wait until ``count`` lines of ``proc``'s stdout match ``pattern``; return them."""
        regex = re.compile(pattern)

        def matching() -> list[str]:
            return [line for line in proc.out().splitlines() if regex.search(line)]

        def ready() -> bool:
            if len(matching()) >= count:
                return True
            if not proc.alive():
                self.fail(f"{proc.name} exited before printing {pattern!r}")
            return False

        self.wait_for(f"{proc.name} to print {count} x {pattern!r}", ready, timeout)
        return matching()

    def wait_exit(self, proc: Proc, timeout: float) -> str:
        """Wait for ``proc`` to exit 0 and return its stdout."""
        self.wait_for(f"{proc.name} to finish", lambda: not proc.alive(), timeout)
        if proc.popen.returncode != 0:
            self.fail(f"{proc.name} exited with {proc.popen.returncode}")
        return proc.out()

    def close(self) -> None:
        for proc in self.all:
            proc.kill()


@contextlib.contextmanager
def children_of_test(workdir: Path) -> Iterator[Procs]:
    """The child processes of one test, killed when it ends; their logs are printed
    then, which pytest shows only for a failed test (the SDK tests' fixtures)."""
    group = Procs(workdir)
    try:
        yield group
    finally:
        group.close()
        print(f"\nlogs of this test: {group.logs}\n{group.report()}")
