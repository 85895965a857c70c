"""The activation arena: the buffers a plan's tensors live in, reused by liveness.

A unit of its own (as TFLite Micro's arena planner is): it sees only storages with their padded
sizes and their first and last step, never a device, so it is tested alone
(``tests/plan/test_arena.py``).
"""

from __future__ import annotations

__all__ = ["arena"]

#: bytes per element of an activation buffer (float32)
ELEMENT_BYTES = 4


def arena(inputs: list, storages: list, released: frozenset = frozenset()) -> list:
    """``[(bytes, [storages])]``: one buffer per entry, each holding storages whose lifetimes do
    not overlap (best fit among the free buffers, else the largest free one grown, else a new one;
    storages taken by first use, larger first).

    Each input has a buffer of its own, exactly its size, written whole by every run (never grown,
    so an upload never covers part of a larger buffer); no other tensor shares it, but for an input
    in ``released``, read only by the step that pads it on the device: its buffer is free for later
    tensors that fit it once that step ran. A view (a storage with a ``base``) lives in its base's
    buffer and takes none.

    Args:
        inputs: the plan's input values (``value.storage`` each).
        storages: every storage of the plan, each with ``first`` and ``last`` (the steps that first
            and last touch it), ``elements()`` and ``base``.
        released: ``id()`` of the input storages whose buffers later tensors may reuse.
    """
    taken = {id(v.storage) for v in inputs}
    buffers = [
        [ELEMENT_BYTES * v.storage.elements(), v.storage.last if id(v.storage) in released else 2**62, [v.storage]]
        for v in inputs
    ]
    for storage in sorted(storages, key=lambda s: (s.first, -s.elements())):
        if id(storage) in taken or storage.base is not None:
            continue
        need = ELEMENT_BYTES * storage.elements()
        free = [b for b in buffers if b[1] < storage.first and b[0] >= need]
        if free:
            chosen = min(free, key=lambda b: b[0])
        else:
            grow = [b for b in buffers[len(inputs) :] if b[1] < storage.first]  # an input's is never grown
            if grow:
                chosen = max(grow, key=lambda b: b[0])
            else:
                chosen = [0, -2, []]
                buffers.append(chosen)
            chosen[0] = max(chosen[0], need)
        chosen[1] = storage.last
        chosen[2].append(storage)
    return [(size, held) for size, _, held in buffers]
