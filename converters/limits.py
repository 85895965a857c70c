"""How much a Keras file may make malinn read, checked on declared sizes before anything is read.

A ``.keras`` archive declares each member's uncompressed size, an HDF5 dataset its shape and
type; both can claim gigabytes in a file of a few kilobytes (a zip bomb; a dataset whose storage
was never written reads as gigabytes of fill values). So, before reading:

* ``config.json`` and ``metadata.json`` declare at most :data:`MAX_JSON_BYTES` (as may an HDF5
  file's ``model_config`` or a malinn file's ``config`` attribute hold);
* ``model.weights.h5`` declares at most what the config's layers can hold (:func:`member_limit`:
  their weights in float64 and three optimizer slots each, plus HDF5 bookkeeping) and at most
  :data:`MAX_MEMBER_BYTES`; a compressed member larger than :data:`RATIO_FLOOR` expands at most
  :data:`MAX_COMPRESSION_RATIO` times (Keras stores the member uncompressed; float weights
  compress by a few percent);
* the weight datasets read declare, together, at most what the config's layers hold (in float64)
  and at most :data:`MAX_WEIGHTS_BYTES` (:class:`WeightBudget`), each one at most
  :data:`MAX_EXPANSION` times the bytes the file stores for it.

What the config implies is known when every layer of the chain is one whose weights follow from
its config and the width of its input (Dense, BatchNormalization, ...); otherwise only the fixed
limits apply.
"""

from __future__ import annotations

import math
import zipfile
from typing import Any

from malinn.errors import ConversionError

from .chain import LayerEntry, ModelNode, iter_layers
from .validate import SHAPE_PRESERVING

MAX_JSON_BYTES = 16 << 20  # parsed, a JSON text takes many times its size in memory
MAX_WEIGHTS_BYTES = 2 << 30
MAX_MEMBER_BYTES = 4 << 30
MAX_COMPRESSION_RATIO = 100
RATIO_FLOOR = 16 << 20
MAX_EXPANSION = 64
#: a chunked weight dataset's chunks hold at least this many bytes on average (h5py makes 8 KiB and
#: more; Keras writes its weights unchunked), and a file's weights at most MAX_CHUNKS chunks
MIN_CHUNK_BYTES = 4096
MAX_CHUNKS = 1 << 16
#: Allowances on top of the config's tensors: small variables (seed generators, optimizer
#: counters) and HDF5's own bookkeeping (about 1.5 KiB per dataset).
SLACK_BYTES = 1 << 20
SLACK_PER_LAYER = 64 << 10

#: Layers whose config and input shape fix their weights; every other (and unknown) layer makes
#: the config's total unknown.
_WEIGHTLESS = (SHAPE_PRESERVING - {"PReLU", "LayerNormalization"}) | {"InputLayer", "Flatten"}


def size_text(n: int) -> str:
    """``3221225472`` -> ``"3.0 GiB (3221225472 bytes)"``."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit} ({n} bytes)"
    return f"{n} bytes"


def _positive_int(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def _declared_width(leaf: LayerEntry) -> int | None:
    """The input width a layer's config records (Keras 3 build_config, Keras 2 batch shapes)."""
    build = leaf.entry.get("build_config")
    candidates = [build.get("input_shape") if isinstance(build, dict) else None]
    candidates += [leaf.config.get("batch_input_shape"), leaf.config.get("batch_shape")]
    for shape in candidates:
        if isinstance(shape, list) and shape:
            width = _positive_int(shape[-1])
            if width is not None:
                return width
    return None


def implied_weight_count(root: ModelNode) -> int | None:
    """An upper bound on the number of weight values the model's layers hold, from the config.

    Dense counts kernel, bias, an int8 scale per unit and its LoRA factors; BatchNormalization and
    LayerNormalization four vectors; PReLU one value per input value. None when a layer's count
    cannot be known from the config.
    """
    shape = root.input_shape if root.input_shape is not None else None
    last = _positive_int(shape[-1]) if shape else None
    total = 0
    for leaf, _trail in iter_layers(root):
        kind = leaf.class_name
        if kind == "Flatten":
            known = shape is not None and all(_positive_int(d) for d in shape)
            shape = (math.prod(shape),) if known and shape is not None else None
            last = shape[0] if shape else None
            continue
        if kind in _WEIGHTLESS:
            continue
        width = last or _declared_width(leaf)
        if width is None:
            return None
        if kind == "Dense":
            units = _positive_int(leaf.config.get("units"))
            if units is None:
                return None
            rank = _positive_int(leaf.config.get("lora_rank")) or 0
            total += (width + 2) * units + rank * (width + units)
            shape = tuple(shape[:-1]) + (units,) if shape else None
            last = units
        elif kind in ("BatchNormalization", "LayerNormalization"):
            # over the last axis or (another axis, several axes) at most the whole sample
            known = shape is not None and all(_positive_int(d) for d in shape)
            total += 4 * (math.prod(shape) if known and shape is not None else width)
        elif kind == "PReLU" and shape is not None and all(_positive_int(d) for d in shape):
            total += math.prod(shape)
        else:
            return None
    return total


def _layer_count(root: ModelNode) -> int:
    return sum(1 for _ in iter_layers(root))


def member_limit(root: ModelNode) -> tuple[int, str]:
    """The most ``model.weights.h5`` may declare, and what sets it (for the message)."""
    count = implied_weight_count(root)
    if count is not None:
        implied = count * 8 * 4 + SLACK_BYTES + SLACK_PER_LAYER * _layer_count(root)
        if implied < MAX_MEMBER_BYTES:
            return implied, "what the config's layers can hold with an optimizer's state"
    return MAX_MEMBER_BYTES, "malinn's limit for a weights file"


def check_member(info: zipfile.ZipInfo, limit: int, why: str, source: str) -> None:
    """Refuse an archive member that declares more than ``limit`` bytes or expands suspiciously.

    Raises:
        ConversionError: naming the member, its declared size and the limit.
    """
    declared = info.file_size
    if declared > limit:
        raise ConversionError(
            f"{source}: archive member {info.filename} declares {size_text(declared)} "
            f"uncompressed, more than {why} ({size_text(limit)}); refused before reading it"
        )
    packed = max(info.compress_size, 1)
    if (
        info.compress_type != zipfile.ZIP_STORED
        and declared > RATIO_FLOOR
        and declared > MAX_COMPRESSION_RATIO * packed
    ):
        raise ConversionError(
            f"{source}: archive member {info.filename} declares {size_text(declared)} "
            f"uncompressed from {size_text(packed)} compressed ({declared // packed}:1, more than "
            f"the {MAX_COMPRESSION_RATIO}:1 that model weights compress); refused before reading it"
        )


class WeightBudget:
    """What the weight datasets read from one file may declare, in all and each.

    Args:
        root: the model, whose config sets the total (see :func:`implied_weight_count`); None: the
            limit alone (a malinn model file's).
        source: the file, for messages.
    """

    def __init__(self, root: ModelNode | None, source: str):
        self.source = source
        count = implied_weight_count(root) if root is not None else None
        self.limit, self.why = MAX_WEIGHTS_BYTES, "malinn's limit for a model's weights"
        if count is not None:
            implied = count * 8 + SLACK_BYTES
            if implied < self.limit:
                self.limit, self.why = implied, "what the config's layers hold"
        self.used = 0
        self.chunks = 0

    def take(self, dataset: Any, where: str) -> None:
        """Count a dataset before it is read.

        Raises:
            ConversionError: the dataset declares more than the file stores for it (beyond
                compression), or the datasets so far declare more than the budget.
        """
        shape = dataset.shape or ()
        declared = math.prod(shape) * dataset.dtype.itemsize
        stored = dataset.id.get_storage_size()
        if declared > MAX_EXPANSION * stored + SLACK_BYTES:
            raise ConversionError(
                f"{self.source}: weight {where} declares shape {tuple(shape)} of {dataset.dtype} "
                f"({size_text(declared)}) but the file stores {size_text(stored)} of it; "
                "refused before reading it"
            )
        chunks = math.prod(-(-n // c) for n, c in zip(shape, dataset.chunks)) if dataset.chunks else 1
        if chunks > max(64, declared // MIN_CHUNK_BYTES) or self.chunks + chunks > MAX_CHUNKS:
            # HDF5 keeps about 4 KiB of bookkeeping per chunk it reads: 2**24 chunks of 4 bytes took 19 GB
            raise ConversionError(
                f"{self.source}: weight {where} is stored in {chunks} chunks of {dataset.chunks} "
                f"({'with the ' + str(self.chunks) + ' before it, ' if self.chunks else ''}more than malinn reads: "
                f"chunks of {MIN_CHUNK_BYTES} bytes or more on average, {MAX_CHUNKS} in a file); refused before "
                "reading it"
            )
        self.chunks += chunks
        declared = math.prod(shape) * max(dataset.dtype.itemsize, 4)  # what it takes once read, as float32
        if self.used + declared > self.limit:
            raise ConversionError(
                f"{self.source}: weight {where} declares shape {tuple(shape)} of {dataset.dtype} "
                f"({size_text(declared)}), which brings the weights read to "
                f"{size_text(self.used + declared)}, more than {self.why} "
                f"({size_text(self.limit)}); refused before reading it"
            )
        self.used += declared
