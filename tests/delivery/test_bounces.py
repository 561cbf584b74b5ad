"""The bounce tracker (``server/delivery/bounces.py``) on its own, with explicit instants."""

from __future__ import annotations

from troth.server.delivery.bounces import BounceTracker, Hold, Refusal

ADDR = "poll://any@workers"


def bounce(t: BounceTracker, task: str, now: int) -> Hold | None:
    hold = t.hold(task, now)
    t.bounced(task, now, hold, ADDR)
    return hold


def test_the_hold_doubles_from_the_third_bounce_and_is_capped() -> None:
    t = BounceTracker(1000)
    delays = [getattr(bounce(t, "a", n), "delay_ms", 0) for n in range(10)]
    assert delays == [0, 0, 50, 100, 200, 400, 800, 1000, 1000, 1000]
    assert t.bounces == 10 and t.backoffs == 8


def test_hold_reads_without_changing_anything() -> None:
    """A re-run batch asks again and must get the same answer."""
    t = BounceTracker(5000)
    for n in range(3):
        bounce(t, "a", n)
    assert t.hold("a", 10) == t.hold("a", 10) == Hold(100, 4)
    assert t.bounces == 3


def test_progress_forgets_and_tasks_are_independent() -> None:
    t = BounceTracker(5000)
    for n in range(4):
        bounce(t, "a", n)
        bounce(t, "b", n)
    t.progressed("a")
    assert t.hold("a", 10) is None
    assert t.hold("b", 10) == Hold(200, 5)


def test_an_episode_ends_a_window_after_the_last_re_offer() -> None:
    t = BounceTracker(5000, window_ms=1000)
    for n in range(3):
        bounce(t, "a", n)  # the third held 50 ms: re-offered at 52
    assert t.hold("a", 52 + 1000) is not None
    assert t.hold("a", 52 + 1001) is None
    assert t.in_backoff(52 + 1000) == 1
    assert t.in_backoff(52 + 1001) == 0
    assert t.hold("a", 1) is None  # the clock went back (debug time): a new episode


def test_the_warning_comes_once_per_episode_with_the_refusal() -> None:
    t = BounceTracker(5000)
    t.refused("a", 0, Refusal("task.suspend", 422, "Awaited promise x is not external", "c-9"))
    episodes = [t.bounced("a", n, t.hold("a", n), ADDR) for n in range(5)]
    assert episodes[-1].warned and episodes[-1].group == "workers"
    assert episodes[-1].refusal is not None
    assert episodes[-1].refusal.describe() == (
        "task.suspend 422 'Awaited promise x is not external' corrId=c-9"
    )


def test_capacity_forgets_the_least_recently_touched() -> None:
    t = BounceTracker(5000, capacity=2)
    for n in range(3):
        bounce(t, "a", n)
    bounce(t, "b", 3)
    bounce(t, "a", 4)  # a touched after b
    bounce(t, "c", 5)  # b goes
    assert list(t.tasks) == ["a", "c"]
    assert t.hold("a", 6) == Hold(200, 5)


def test_expedite_takes_the_held_tasks_of_the_group_once() -> None:
    t = BounceTracker(5000)
    for n in range(3):
        bounce(t, "a", n)
    for n in range(3):
        t.bounced("b", n, t.hold("b", n), "poll://any@other")
    bounce(t, "c", 0)  # not held
    assert t.expedite("nobody") == []
    assert t.expedite("workers") == ["a"]
    assert t.expedite("workers") == []  # nothing held any more
    assert t.hold("a", 3) == Hold(100, 4)  # the episode goes on
