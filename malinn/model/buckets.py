"""The batch sizes a model is planned for: a pass's samples rounded to a bucket, so that large
passes share plans."""

from __future__ import annotations

import numpy as np

__all__ = ["batch_bucket", "bucket_floor", "samples"]


def batch_bucket(n: int) -> int:
    """The batch size a pass of ``n`` samples is planned for: ``n`` itself up to 256 (a plan of its
    own per size, so nothing is padded where serving latency matters), then the next multiple of
    64 (large passes share plans; padded samples are computed and dropped).

    Raises:
        ValueError: ``n`` is not a positive whole number of samples.
    """
    n = samples(n, "a pass holds")
    return n if n <= 256 else -(-n // 64) * 64


def bucket_floor(n: int) -> int:
    """The largest pass size of at most ``n`` samples (at least 1) that is its own bucket, so that
    a pass of it pads nothing: ``n`` up to 256, a multiple of 64 above."""
    n = max(1, int(n))
    return n if n <= 256 else n - n % 64


def samples(n: object, what: str) -> int:
    """``n`` as an int where it is a positive whole number of samples, else a ValueError saying ``what``."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"{what} a positive whole number of samples, got {n!r}")
    return int(n)
