"""Views: a Reshape whose result its input's buffer already holds, and a Concatenate input that
its matmul can write straight into its slice, launch nothing (the view's Storage has a base and no
buffer of its own)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..kinds.layout import RESHAPE
from ..kinds.matmul import MATMUL
from ..kinds.merge import CONCAT
from ..tensors import Step, Storage, Value

if TYPE_CHECKING:
    from ..recorder import Recorder

__all__ = ["view_reshapes", "concat_slices", "view_concat_slices"]


def _keras_flat(value: Value) -> bool:
    """Whether ``value``'s buffer holds its elements in Keras's flat order, contiguous from the
    first float on, with all its padding after them: C with unpadded rows (or one column), or R
    with one column or one row."""
    storage = value.storage
    if str(storage.layout) == "C":
        return storage.padded_size[0] == value.rows or value.cols == 1
    if str(storage.layout) == "R":
        return storage.padded_size[1] == 1 or value.rows == 1
    return False


def view_reshapes(builder: Recorder, outputs: list[Value]) -> None:
    """A reshape whose result's matrix view lies in its input's memory as the layout already holds
    it becomes a view of that memory (nothing launched): the same matrix in the same layout (read
    with the input's leading dimension, no further than its padding), or, where both buffers hold
    their values in Keras's flat order from the first float on (:func:`_keras_flat`), any shape
    whose padding falls inside the input's buffer (where the input's padding, zeros, lies). Kept as
    a copy where an in-place step would write the shared memory while the other tensor is still
    read."""
    for index, step in enumerate(builder.steps):
        if step.kind is not RESHAPE or step.view:
            continue
        x, y = step.inputs["a"], step.out
        xs, ys = x.storage, y.storage
        same = (
            str(xs.layout) == str(ys.layout)
            and (x.rows, x.cols) == (y.rows, y.cols)
            and (
                xs.padded == ys.padded  # (R: fewer padded rows read, C: fewer padded columns; both zeros)
                or str(xs.layout) == "R"
                and xs.padded_size[1] == ys.padded_size[1]
                and ys.padded_size[0] <= xs.padded_size[0]
                or str(xs.layout) == "C"
                and xs.padded_size[0] == ys.padded_size[0]
                and ys.padded_size[1] <= xs.padded_size[1]
            )
        )
        flat = (
            _keras_flat(x)
            and _keras_flat(y)
            and ys.padded_size[0] * ys.padded_size[1] <= xs.padded_size[0] * xs.padded_size[1]
        )
        if not (same or flat) or ys.base is not None or ys is xs:
            continue
        if _writes_while_read(builder.steps, index, xs.memory(), ys, outputs):
            continue
        ys.base = xs.memory()
        step.view = True


def concat_slices(builder: Recorder, outputs: list[Value]) -> list[tuple[list[Step], list[Step]]]:
    """The Concatenate steps (on the last axis) whose input a matmul can write straight into its
    slice of the result (its kernel's epilogue takes ``view``, both in R or both in C, the input
    read by nothing else): ``[(concat steps of one result, [the steps whose inputs may be
    views])]``, on OpenCL (the GL kernels take no views). Couples each such input's column padding
    with the result's, so the slice has the result's columns (decided for good by
    :func:`view_concat_slices`)."""
    chains: dict = {}
    for step in builder.steps:
        if step.kind is CONCAT:
            chains.setdefault(id(step.out.storage), []).append(step)
    found = []
    for chain in chains.values():
        result = chain[-1].out.storage
        writable = []
        for step in chain:
            x = step.inputs["a"]
            producer = x.producer
            if (
                builder.device.backend == "opencl"
                and int(step.spec.config.get("INNER", 0)) == 1
                and producer is not None
                and producer.kind is MATMUL
                and "view" in producer.spec.epilogue
                and x.consumers == [step]
                and x not in outputs
                and x.storage is not result
                and str(x.storage.layout) in ("R", "C")
                and str(x.storage.layout) == str(result.layout)
                and not any(s.out.storage is x.storage for s in builder.steps if s is not producer)
            ):
                writable.append(step)
                x.storage.root().group = result.root()
        if writable:
            found.append((chain, writable))
    return found


def view_concat_slices(found: list[tuple[list[Step], list[Step]]]) -> None:
    """Makes the inputs :func:`concat_slices` found views into the Concatenate's buffer: the matmul
    writes its slice (rows ``OFFSET`` to ``OFFSET + ALEN`` of the result's matrix view) through
    ``R_AT`` with an offset and a leading dimension, and that input's concat step launches
    nothing. The padding of the result is zeroed by a concat step that stays (the last input's,
    where every input was a view and the result has padded rows)."""
    for chain, writable in found:
        result = chain[-1].out.storage
        rows, cols = result.padded_size
        total = int(chain[0].spec.config["RLEN"])
        views = [step for step in writable if step.inputs["a"].storage.padded_size[1] == cols]
        last = chain[-1]
        # the last slice's kernel writes the result's padding rows too (as zeros) where its own
        # padded rows reach that far; else a concat launch stays to zero them
        covers = last in views and last.inputs["a"].storage.padded_size[0] >= rows - int(last.spec.config["OFFSET"])
        if len(views) == len(chain) and rows > total and not covers:
            views = views[:-1]
        if not views:
            continue
        for step in views:
            x = step.inputs["a"]
            offset = int(step.spec.config["OFFSET"])
            row_major = str(result.layout) == "R"
            x.storage.base = result
            x.storage.view = {
                "R_VIEW": 1,
                "R_OFFSET": offset * cols if row_major else offset,
                "R_LD": cols if row_major else rows,
                "R_ROWS": rows - offset if step is last else x.rows,
                "R_SPARE": rows * cols,
            }
            step.view = True
        result.min_elements = rows * cols + 1  # the spare float that rows past a slice go to
        kept = [step for step in chain if not step.view]
        for i, step in enumerate(kept):
            step.spec = step.spec.configure({"FIRST": int(i == 0)})


def _writes_while_read(steps: list[Step], index: int, memory: Storage, view: Storage, outputs: list[Value]) -> bool:
    """Whether, after step ``index``, an in-place step writes ``view`` while a tensor in ``memory``
    is read at or after it, or writes ``memory`` while ``view`` is read then (outputs count as read
    at the end)."""
    end = len(steps)

    def held(storage: Storage, group: Storage) -> bool:
        return storage is group if group is view else storage.memory() is group

    def first_write(group: Storage) -> int:
        return next(
            (j for j in range(index + 1, end) if steps[j].in_place and held(steps[j].out.storage, group)), end + 1
        )

    def last_read(group: Storage) -> int:
        reads = [j for j in range(index + 1, end) for v in steps[j].inputs.values() if held(v.storage, group)]
        reads += [end for v in outputs if held(v.storage, group)]
        return max(reads, default=-1)

    return first_write(view) <= last_read(memory) or first_write(memory) <= last_read(view)
