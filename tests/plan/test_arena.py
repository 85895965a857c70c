"""The activation arena alone (malinn/plan/arena.py): storages with lifetimes and sizes, no device."""

from __future__ import annotations

import itertools
import random

import pytest

from malinn.plan.arena import ELEMENT_BYTES, arena


class FakeValue:
    def __init__(self, storage):
        self.storage = storage


class Held:
    """What the arena reads of a storage: its elements, first and last step, and base."""

    def __init__(self, elements: int, first: int, last: int, base=None):
        self.n, self.first, self.last, self.base = elements, first, last, base

    def elements(self) -> int:
        return self.n


def overlapping(a: Held, b: Held) -> bool:
    return not (a.last < b.first or b.last < a.first)


def check(inputs, storages, buffers):
    """Every storage (not a view) in exactly one buffer large enough for it; no two storages of one
    buffer alive at once; each input alone in a buffer of exactly its size."""
    placed = [s for _, held in buffers for s in held]
    expected = [s for s in storages if s.base is None]
    assert sorted(map(id, placed)) == sorted(map(id, expected))
    for size, held in buffers:
        assert all(size >= ELEMENT_BYTES * s.elements() for s in held)
        for a, b in itertools.combinations(held, 2):
            assert not overlapping(a, b), (a.first, a.last, b.first, b.last)
    for value in inputs:
        size, held = next(item for item in buffers if value.storage in item[1])
        assert held == [value.storage] and size == ELEMENT_BYTES * value.storage.elements()


def test_a_chain_reuses_two_buffers():
    x = Held(100, -1, 0)
    steps = [Held(50 + i, i, i + 1) for i in range(6)]  # each read by the next step only
    buffers = arena([FakeValue(x)], [x] + steps)
    check([FakeValue(x)], [x] + steps, buffers)
    assert len(buffers) == 3  # the input's own, and two that alternate
    assert sorted(size for size, _ in buffers) == [ELEMENT_BYTES * 54, ELEMENT_BYTES * 55, ELEMENT_BYTES * 100]


def test_a_view_takes_no_buffer_and_a_long_lived_tensor_keeps_its_own():
    x = Held(8, -1, 0)
    skip = Held(30, 0, 5)  # read again at the end (a residual connection)
    mid = [Held(30, i, i + 1) for i in range(1, 5)]
    view = Held(30, 2, 3, base=mid[1])
    storages = [x, skip, *mid, view]
    buffers = arena([FakeValue(x)], storages)
    check([FakeValue(x)], storages, buffers)
    assert not any(view in held for _, held in buffers)
    assert next(held for _, held in buffers if skip in held) == [skip]


@pytest.mark.parametrize("seed", range(20))
def test_random_lifetimes_never_share_a_live_buffer(seed):
    rng = random.Random(seed)
    inputs = [Held(rng.randint(1, 4096), -1, rng.randint(0, 40)) for _ in range(rng.randint(1, 3))]
    storages = list(inputs)
    for _ in range(rng.randint(1, 200)):
        first = rng.randint(0, 40)
        storages.append(Held(rng.choice([1, 3, 13, 1001, 4096]), first, first + rng.randint(0, 10)))
    buffers = arena([FakeValue(s) for s in inputs], storages)
    check([FakeValue(s) for s in inputs], storages, buffers)
    assert sum(size for size, _ in buffers) <= ELEMENT_BYTES * sum(s.elements() for s in storages)


def test_nothing_to_place_gives_no_buffer():
    assert arena([], []) == []
