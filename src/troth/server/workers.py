"""``troth serve --workers N``: N processes serving one port, one service.

One troth process is one event loop and one writer sharing one interpreter lock: it
uses about one core.  On PostgreSQL, several processes already make one service (a
cluster of nodes: ``server/delivery/cluster.py``), so the way to use a machine's cores is N
nodes on one machine.  This module is their supervisor:

* clients see one port: every child listens on it with ``SO_REUSEPORT``, so the
  kernel spreads new connections evenly over the children (one socket shared by all
  was measured to give 40, 17, 6 and 1 of 64 connections to four children: whoever
  wakes first takes a burst); the supervisor holds the port bound, not listening,
  so nothing else takes it while a child restarts;
* each child is a whole troth node (its own store sessions, writer, timer, delivery,
  node id, heartbeats); nothing is shared in memory, so a child that dies loses
  nothing acknowledged, and the other nodes take over its claims as they do for a
  dead node on another machine;
* a child that exits when it was not told to is started again (after a pause that
  grows while children keep dying young: a broken configuration must not spin);
* SIGTERM or SIGINT to the supervisor stops every child gracefully (each finishes its
  requests, as one ``troth serve`` does) and the supervisor exits when they have; a
  child still running after the grace period is killed.

Children are forked before the supervisor starts any thread or event loop: what
they inherit is the settings, and the function that serves one node on a socket
(``run.serve_on``, handed to :func:`supervise`: this module knows nothing of what a
node is made of).  The supervisor itself opens no store: it connects to
the database once, to refuse a start that every child would fail, and hangs up.  A child that
dies loses the connections the kernel had queued for it but it had not accepted
(their clients see a reset and retry), as a single process that dies does.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from multiprocessing.context import ForkProcess
from types import FrameType

from troth.plural import counted
from troth.server.config import Settings
from troth.server.startup import (
    EXIT_LISTEN,
    cannot_listen,
)

log = logging.getLogger("troth.workers")

#: Serves one node on a listening socket until it stops, and returns its exit status
#: (``run.serve_on``).
Serve = Callable[[Settings, socket.socket], int]

#: Seconds a child may take to stop after SIGTERM before it is killed (it finishes
#: its in-flight requests first: uvicorn's graceful shutdown takes up to 10 s).
STOP_GRACE = 20.0
#: prctl(2) option: the signal a process gets when its parent dies.
PR_SET_PDEATHSIG = 1
#: A child that lived less than this died young (its restart waits longer).
YOUNG = 5.0
#: Longest pause before restarting a child that keeps dying young.
MAX_PAUSE = 10.0


def bind(settings: Settings, *, listen: bool) -> socket.socket:
    """A socket on ``host``:``port`` in the port's ``SO_REUSEPORT`` group: a child's
    listening socket, or (``listen`` False) the supervisor's hold on the port."""
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((settings.host, settings.port))
        if listen:
            sock.listen(2048)
    except BaseException:
        sock.close()
        raise
    return sock


def child_settings(settings: Settings, index: int) -> Settings:
    """Child ``index``'s settings: one process (``workers`` 1), and, when the operator
    named the node, that name with the child's number (node ids must differ)."""
    node_id = f"{settings.node_id}-{index}" if settings.node_id else ""
    return replace(settings, workers=1, node_id=node_id)


class Supervisor:
    """Starts, watches and stops the children (see the module docstring)."""

    def __init__(self, settings: Settings, hold: socket.socket, serve: Serve) -> None:
        self.settings = settings
        self.hold = hold
        self.serve = serve
        self.stopping = False
        self.children: dict[int, ForkProcess] = {}
        self.started_at: dict[int, float] = {}
        self.deaths = 0
        self._context = multiprocessing.get_context("fork")

    def start(self, index: int) -> None:
        process = self._context.Process(
            target=_child_main,
            args=(child_settings(self.settings, index), self.hold.fileno(), self.serve),
            name=f"troth-worker-{index}",
        )
        process.start()
        self.children[index] = process
        self.started_at[index] = time.monotonic()
        log.info("worker %d started (pid %s)", index, process.pid)

    def run(self) -> int:
        for index in range(self.settings.workers):
            self.start(index)
        previous = {sig: signal.signal(sig, self._stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            while not self.stopping:
                self._watch()
                time.sleep(0.2)
            return self._stop_all()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True

    def _watch(self) -> None:
        """Start again any child that exited (the supervisor was not stopping)."""
        for index, process in list(self.children.items()):
            if process.is_alive() or self.stopping:
                continue
            lived = time.monotonic() - self.started_at[index]
            log.warning(
                "worker %d (pid %s) exited with %s after %.1f s; starting it again",
                index,
                process.pid,
                _exit_words(process.exitcode),
                lived,
            )
            process.close()
            # Gone from the children until started again: a stop that comes during
            # the pause below must not find (and query) a closed process.
            del self.children[index]
            self.deaths = self.deaths + 1 if lived < YOUNG else 0
            if self.deaths:
                pause = min(MAX_PAUSE, 0.5 * 2 ** (self.deaths - 1))
                deadline = time.monotonic() + pause
                while time.monotonic() < deadline and not self.stopping:
                    time.sleep(0.05)
                if self.stopping:
                    return
            self.start(index)

    def _stop_all(self) -> int:
        """SIGTERM to every child, wait up to :data:`STOP_GRACE`, then SIGKILL."""
        log.info("stopping %s", counted(len(self.children), "worker"))
        for process in self.children.values():
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE
        for process in self.children.values():
            process.join(max(0.0, deadline - time.monotonic()))
        killed = 0
        for index, process in self.children.items():
            if process.is_alive():
                log.warning("worker %d did not stop within %.0f s: killed", index, STOP_GRACE)
                process.kill()
                process.join()
                killed += 1
        self.hold.close()
        return 1 if killed else 0


def _exit_words(code: int | None) -> str:
    if code is not None and code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"code {code}"


def _child_main(settings: Settings, hold: int, serve: Serve) -> None:
    """One child: a whole troth node (``serve``) on a listening socket of its own in
    the port's ``SO_REUSEPORT`` group."""
    # The supervisor's handlers were inherited with the fork; uvicorn installs its own
    # (graceful shutdown) when it starts, until then the defaults apply.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    # Out of the terminal's process group: a Ctrl-C reaches the supervisor alone, which
    # stops each child once (a second signal would make uvicorn skip its graceful
    # shutdown).
    os.setpgrp()
    _die_with_parent()
    os.close(hold)  # the supervisor's hold on the port is not the child's to keep
    try:
        sock = bind(settings, listen=True)
    except OSError as exc:
        print(f"troth: {cannot_listen(settings.host, settings.port, exc)}", file=sys.stderr)
        sys.exit(EXIT_LISTEN)
    sys.exit(serve(settings, sock))


def _die_with_parent() -> None:
    """Linux: SIGTERM this child when the supervisor dies, even by SIGKILL, so no
    orphan node keeps serving the port with nobody watching it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        return  # not Linux: the supervisor's stop is the only way down
    if os.getppid() == 1:  # the supervisor died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def supervise(settings: Settings, check: Callable[[], int | None], serve: Serve) -> int:
    """Bind, check the store once (``check``: an exit status stops the start), start
    ``settings.workers`` children, each a node that ``serve`` runs on its own socket,
    and supervise them until told to stop."""
    try:
        hold = bind(settings, listen=False)
    except OSError as exc:
        print(f"troth: {cannot_listen(settings.host, settings.port, exc)}", file=sys.stderr)
        return EXIT_LISTEN
    # Once, before any child: each would fail the same way and be started again
    # forever; and the schema is migrated by one process, not raced by several.
    refused = check()
    if refused is not None:
        hold.close()
        return refused
    log.info(
        "troth: %d workers on %s:%d (store=postgres)",
        settings.workers,
        settings.host,
        settings.port,
    )
    return Supervisor(settings, hold, serve).run()
