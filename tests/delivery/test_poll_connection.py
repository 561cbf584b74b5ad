"""One SSE connection's queue and its writer's single wait (transport/poll.py).

The stream's writer waits on one future that an offer, the peer leaving or the node
closing resolves, with one timer for the keep-alive; these pin what each of them
does to a waiting writer, without a server around it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from troth.protocol.address import parse_poll
from troth.transport.poll import QUEUE_SIZE, Connection, Registry

T = TypeVar("T")


def run(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return asyncio.run(main())


def test_an_offer_wakes_a_waiting_writer_at_once() -> None:
    async def main() -> tuple[bytes | None, float]:
        conn = Connection("g", "id", 1)
        started = time.perf_counter()
        waiting = asyncio.create_task(conn.next(5.0))
        await asyncio.sleep(0.01)
        assert conn.waiter is not None  # it is waiting on its one future
        fut = conn.offer(b"m1")
        assert fut is not None
        delivery = await waiting
        assert conn.waiter is None  # the wait and its keep-alive timer are gone
        return (None if delivery is None else delivery.payload), time.perf_counter() - started

    payload, elapsed = run(main)
    assert payload == b"m1"
    assert elapsed < 1.0  # not the 5 s keep-alive


def test_queued_messages_come_in_order_without_waiting() -> None:
    async def main() -> list[bytes]:
        conn = Connection("g", "id", 1)
        for m in (b"a", b"b", b"c"):
            assert conn.offer(m) is not None
        out = []
        for _ in range(3):
            d = await conn.next(5.0)
            assert d is not None
            out.append(d.payload)
        return out

    assert run(main) == [b"a", b"b", b"c"]


def test_nothing_within_the_keepalive_answers_none() -> None:
    async def main() -> tuple[object, float]:
        conn = Connection("g", "id", 1)
        started = time.perf_counter()
        got = await conn.next(0.05)
        return got, time.perf_counter() - started

    got, elapsed = run(main)
    assert got is None
    assert 0.04 <= elapsed < 1.0


def test_wake_without_a_message_answers_none_at_once() -> None:
    """What the peer's disconnect and the node's closing do to the writer."""

    async def main() -> tuple[object, float]:
        conn = Connection("g", "id", 1)
        started = time.perf_counter()
        waiting = asyncio.create_task(conn.next(5.0))
        await asyncio.sleep(0.01)
        conn.wake()
        got = await waiting
        return got, time.perf_counter() - started

    got, elapsed = run(main)
    assert got is None
    assert elapsed < 1.0


def test_close_fails_what_is_queued_and_refuses_more() -> None:
    async def main() -> tuple[list[bool], object, object, float]:
        conn = Connection("g", "id", 1)
        futs = [conn.offer(b"x"), conn.offer(b"y")]
        conn.close()
        results = [await f for f in futs if f is not None]
        started = time.perf_counter()
        after = await conn.next(5.0)
        return results, conn.offer(b"z"), after, time.perf_counter() - started

    results, refused, after, elapsed = run(main)
    assert results == [False, False]  # never left: retryable
    assert refused is None
    assert after is None
    assert elapsed < 1.0  # a closed stream does not wait for the keep-alive


def test_a_full_queue_refuses_the_next_offer() -> None:
    async def main() -> tuple[int, object]:
        conn = Connection("g", "id", 1)
        taken = sum(conn.offer(b"m") is not None for _ in range(QUEUE_SIZE))
        return taken, conn.offer(b"one too many")

    taken, refused = run(main)
    assert taken == QUEUE_SIZE
    assert refused is None


def test_a_cancelled_writer_leaves_no_wait_behind() -> None:
    async def main() -> object:
        conn = Connection("g", "id", 1)
        waiting = asyncio.create_task(conn.next(5.0))
        await asyncio.sleep(0.01)
        waiting.cancel()
        try:
            await waiting
        except asyncio.CancelledError:
            pass
        assert conn.waiter is None
        fut = conn.offer(b"later")  # an offer after it is queued, not lost
        assert fut is not None
        d = await conn.next(5.0)
        return None if d is None else d.payload

    assert run(main) == b"later"


def test_each_group_rotates_over_its_own_workers() -> None:
    """Anycast sends spread evenly over a group's workers however another group's
    sends interleave with them: a rotation shared by the groups would send every
    second message of group a, between two of group b, to the same worker."""
    registry = Registry()
    for id in ("a1", "a2"):
        registry.connect("a", id)
    for id in ("b1", "b2", "b3"):
        registry.connect("b", id)
    first: dict[str, list[str]] = {"a": [], "b": []}
    for _ in range(6):
        for group, sends in (("a", 1), ("b", 2)):
            for _ in range(sends):
                address = parse_poll(f"poll://any@{group}")
                assert address is not None
                first[group].append(registry.candidates(address)[0].id)
    assert first["a"] == ["a1", "a2"] * 3
    assert first["b"] == ["b1", "b2", "b3"] * 4


def test_the_writer_frames_an_offer_and_answers_it_by_what_became_of_the_write() -> None:
    """One stream from the message offered to the frame written: written, the offer
    answers True; the peer gone first, False and nothing written; a write that broke
    off, its error; nothing offered in time, a keep-alive."""

    async def main() -> tuple[list[bytes], object, object, object]:
        frames: list[bytes] = []
        broken = False

        async def send(message: dict[str, Any]) -> None:
            if broken:
                raise ConnectionResetError("peer reset")
            frames.append(message["body"])

        loop = asyncio.get_running_loop()
        here: asyncio.Future[None] = loop.create_future()
        closing = asyncio.Event()
        conn = Connection("g", "id", 1)
        written = conn.offer(b'{"kind":"execute"}')
        await conn.pump(send, 5.0, here, closing)
        await conn.pump(send, 0.01, here, closing)  # nothing offered: a keep-alive
        broken = True
        cut = conn.offer(b"m2")
        try:
            await conn.pump(send, 5.0, here, closing)
        except ConnectionResetError:
            pass
        gone: asyncio.Future[None] = loop.create_future()
        gone.set_result(None)
        never = conn.offer(b"m3")
        await conn.pump(send, 5.0, gone, closing)
        assert written is not None and cut is not None and never is not None
        return frames, written.result(), cut.exception(), never.result()

    frames, written, cut, never = run(main)
    assert frames == [b'data: {"kind":"execute"}\n\n', b": keepalive\n\n"]
    assert written is True
    assert isinstance(cut, ConnectionResetError)
    assert never is False
