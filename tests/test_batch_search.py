"""The largest-batch search: the same answer asked one batch or several at a time."""
from __future__ import annotations

import os
import sys
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmscore.tune import _largest_batch


def _truth(batch: int, answer: bool) -> bool:
    return answer


def _oracle(threshold: int, limit: int, start: int) -> int:
    """Largest b in [start, limit] with b <= threshold, as _largest_batch defines it."""
    if threshold >= start:
        return min(threshold, limit)
    return start - 1 if start > 1 and start - 1 <= threshold else 0


@settings(max_examples=500, deadline=None)
@given(threshold=st.integers(0, 300), limit=st.integers(1, 300), start=st.integers(1, 40),
       top_first=st.booleans(), known=st.booleans(),
       guess=st.one_of(st.none(), st.integers(-5, 320)))
def test_one_at_a_time_finds_the_threshold(threshold, limit, start, top_first, known, guess):
    """Whatever the guess (asked after the limit where that is asked first), the answer is
    the threshold's; the guess changes only what is asked."""
    start = min(start, limit)
    known = known and start <= threshold
    asked: list[int] = []

    def ask(b: int) -> bool:
        asked.append(b)
        return b <= threshold

    got, answers = _largest_batch(ask, _truth, limit, start, known=known, top_first=top_first,
                                  guess=guess)
    assert got == _oracle(threshold, limit, start)
    assert answers == {b: b <= threshold for b in asked if b >= start}
    assert len(asked) == len(set(asked))  # no batch asked twice
    assert all(start <= b <= limit for b in asked if b != start - 1)  # start-1: start fails
    if 0 < got < limit:
        assert got + 1 in answers  # what stops it was asked
    if top_first and limit > start:
        assert asked[0] == limit


def test_one_at_a_time_is_bisection():
    """The DenseNet's search (117 fits, bound 1,298, 1,213 found): the bound, then halves."""
    asked: list[int] = []
    assert _largest_batch(lambda b: asked.append(b) or b <= 1213, _truth, 1298, 117,
                          known=True, top_first=True)[0] == 1213
    assert asked == [1298, 707, 1002, 1150, 1224, 1187, 1205, 1214, 1209, 1211, 1212, 1213]


def test_the_guess_near_the_bound_saves_asks():
    """The DenseNet's numbers again, with :data:`lmscore.tune.NEAR_BOUND`'s guess."""
    from lmscore.tune import NEAR_BOUND

    asked: list[int] = []
    assert _largest_batch(lambda b: asked.append(b) or b <= 1213, _truth, 1298, 117,
                          known=True, top_first=True, guess=int(NEAR_BOUND * 1298))[0] == 1213
    assert asked == [1298, 1168, 1233, 1200, 1216, 1208, 1212, 1214, 1213]


@settings(max_examples=25, deadline=None)
@given(threshold=st.integers(0, 200), limit=st.integers(1, 200), start=st.integers(1, 20),
       workers=st.integers(2, 3), top_first=st.booleans(), seed=st.integers(1, 97))
def test_forked_workers_find_the_same_batch(threshold, limit, start, workers, top_first,
                                            seed):
    """Answers come back in an order of their own (each child sleeps 0-6 ms)."""
    start = min(start, limit)

    def ask(b: int) -> bool:
        time.sleep((b * seed) % 7 / 1000)
        return b <= threshold

    got, answers = _largest_batch(ask, _truth, limit, start, top_first=top_first,
                                  workers=workers)
    assert got == _oracle(threshold, limit, start)
    assert all(a == (b <= threshold) for b, a in answers.items())


def test_a_useless_batch_is_stopped():
    """Asked at once, 64 (slow) and 32: 32 fails, so 64 can move nothing and is killed."""
    parent = os.getpid()

    def ask(b: int) -> bool:
        if b == 64 and os.getpid() != parent:
            time.sleep(60)
        return b <= 20

    t = time.monotonic()
    got, answers = _largest_batch(ask, _truth, 64, 16, known=True, top_first=True,
                                  workers=2)
    assert got == 20 and 64 not in answers
    assert time.monotonic() - t < 50  # not waited for: it would sleep 60 s


def test_a_childs_exception_is_raised_in_the_parent():
    parent = os.getpid()

    def ask(b: int) -> bool:
        if os.getpid() != parent:
            raise ValueError(f"batch {b} refused")
        return True

    with pytest.raises(ValueError, match="refused"):
        _largest_batch(ask, _truth, 100, 1, workers=2)


def test_a_child_that_dies_is_asked_again_here():
    parent = os.getpid()

    def ask(b: int) -> bool:
        if os.getpid() != parent:
            os._exit(3)
        return b <= 37

    assert _largest_batch(ask, _truth, 100, 1, workers=2)[0] == 37


def test_answers_come_back_from_the_children():
    parent = os.getpid()

    def ask(b: int) -> tuple[bool, bool]:
        time.sleep(0.15)  # slower than a fork: every batch in a worker
        return b <= 9, os.getpid() != parent

    got, answers = _largest_batch(ask, lambda b, a: a[0], 30, 1, workers=2)
    assert got == 9 and all(child for _, child in answers.values())


def test_quick_answers_are_asked_here_after_the_first_workers(monkeypatch):
    """A fork costs more than a quick answer: once two answers came quick, the rest here.

    "Quick" is below ``FORK_ABOVE`` seconds from fork to answer, raised here so that a
    loaded machine, where a fork alone can take longer, still counts these as quick."""
    monkeypatch.setattr(sys.modules["lmscore.tune"], "FORK_ABOVE", 60.0)
    parent = os.getpid()
    got, answers = _largest_batch(lambda b: (b <= 40, os.getpid() == parent),
                                  lambda b, a: a[0], 64, 1, workers=2)
    assert got == 40
    here = [b for b, (_, in_parent) in answers.items() if in_parent]
    # the start, then two at once: when the first answer is in, a third is forked, unless
    # the second came with it; after the second, no more
    assert 2 <= len(answers) - len(here) <= 3 and len(here) >= 5


@st.composite
def _falling_margins(draw):
    """A margin that falls with the batch: a line with steps, bends and caps, like memory
    (sizes linear in the batch, workspaces capped, the allocator's rounding)."""
    fixed = draw(st.integers(-50, 10**7))
    slope = draw(st.integers(0, 10**5))
    bend = draw(st.integers(0, 50))
    cap = draw(st.integers(1, 10**6))
    step_at = draw(st.integers(1, 70_000))
    step = draw(st.integers(0, 10**6))
    rate = draw(st.integers(0, 1000))

    def margin(b: int) -> int:
        return (fixed - slope * b - bend * b * b // 100 - min(cap, 7 * b)
                - (step if b > step_at else 0) - 256 * -(-rate * b // 256))
    return margin


def _by_margin_oracle(margin, limit: int) -> int:
    """Largest b in [1, limit] whose margin is at least 0 (margins fall, so bisect)."""
    lo, hi = 0, limit + 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if margin(mid) >= 0 else (lo, mid)
    return lo


@settings(max_examples=400, deadline=None)
@given(margin=_falling_margins(), limit=st.integers(1, 1 << 16))
def test_the_margin_search_finds_the_largest_batch_within_the_margin(margin, limit):
    from lmscore.tune import _largest_by_margin

    asked: list[int] = []

    def ask(b: int):
        assert 1 <= b <= limit and b not in asked
        asked.append(b)
        return margin(b), b

    got, answers = _largest_by_margin(ask, limit)
    assert got == _by_margin_oracle(margin, limit)
    assert sorted(answers) == sorted(asked) and answers[asked[0]] == (margin(asked[0]), asked[0])
    # never much worse than doubling then bisection (2 log2 of the limit)
    assert len(asked) <= 3 * (limit.bit_length() + 1)


def test_the_margin_search_asks_a_few_batches_on_a_line():
    from lmscore.tune import _largest_by_margin

    asked: list[int] = []

    def ask(b: int):
        asked.append(b)
        return 50_189_700 - 1000 * b - 256 * -(-37 * b // 256), None  # 256-byte rounding

    assert _largest_by_margin(ask, 1 << 16)[0] == 48_398
    assert len(asked) <= 6  # doubling then bisection: 32
