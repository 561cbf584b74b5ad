"""Requests sent to a node over and over while a fault lasts, each kind from a thread
of its own, so that one slow answer does not delay the others (the fault tests:
tests/faults/).  What each probe returns is kept, in the order the answers came."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

A = TypeVar("A")


class Probes(Generic[A]):
    """``probes[kind](i)`` for i = 1, 2, … every ``every`` seconds per kind, for as
    long as the ``with`` block lasts; a probe never raises (it returns its failure)."""

    def __init__(self, probes: dict[str, Callable[[int], A]], every: float, join: float) -> None:
        self.every, self.join = every, join
        self.answers: list[A] = []
        self.stopping = threading.Event()
        self.threads = [
            threading.Thread(target=self._loop, args=(probe,), name=f"probe-{kind}", daemon=True)
            for kind, probe in probes.items()
        ]

    def __enter__(self) -> Probes[A]:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(self.join)

    def _loop(self, probe: Callable[[int], A]) -> None:
        i = 0
        while not self.stopping.is_set():
            i += 1
            self.answers.append(probe(i))
            self.stopping.wait(self.every)
