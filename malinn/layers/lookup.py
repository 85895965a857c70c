"""``IntegerLookup``: integer tokens mapped to their indices in a vocabulary (Keras's preprocessing
layer, ``invert=False``), as indices or encoded as CategoryEncoding encodes them.

The lookup is one kernel (kernels/integer_lookup.cl): the vocabulary sorted, uploaded once, and a
binary search per token (``ceil(log2(V + 1))`` reads of a buffer small enough to stay in cache). A
direct table indexed by the token would take one read, but its size follows the span of the tokens
(ids such as 10^6 and 5 * 10^6 make millions of entries for two tokens), and the lookup is a small
part of any model that has one: one code path whose memory follows the vocabulary's size wins. The
encoded output modes run CategoryEncoding's kernel on the indices; ``"tf_idf"`` is the count times
each index's inverse document frequency (Keras's ``idf_weights`` padded as Keras pads them: the
OOV indices the mean weight where the vocabulary omits them, zeros up to ``max_tokens`` with
``pad_to_max_tokens``), one per-feature scale after the count.

malinn computes in float32: a token is exact up to 2^24 in magnitude, so a vocabulary of larger
tokens is refused; ``StringLookup`` (string tokens) and ``invert=True`` (indices back to tokens)
are refused by name.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy as np

from ..plan import kinds
from ..plan.kinds.encoding import encoded_shape
from ..plan.tensors import Vector
from .base import Layer, numeric_weights
from .category_encoding import SPARSE_REFUSAL, check_encoded_rank, encoding_mode
from .keras_config import KerasContext, NotConvertible

if TYPE_CHECKING:
    from ..plan.builder import PlanBuilder
    from ..plan.tensors import Value

__all__ = ["IntegerLookup", "EXACT_TOKENS"]

#: the largest token magnitude float32 holds exactly (every integer up to it)
EXACT_TOKENS = 2**24

INVERT_REFUSAL = (
    "invert=True (indices mapped back to tokens) is not computed: malinn computes IntegerLookup from "
    "tokens to indices; take the indices and map them back on the host (the layer's get_vocabulary())"
)
STRING_REFUSAL = (
    "(its tokens are strings: malinn takes numeric arrays only; map the strings to integers before "
    "predict and look them up with an IntegerLookup)"
)
#: the output modes besides "int": CategoryEncoding's, and the count weighted by idf_weights
ENCODED_MODES = ("one_hot", "multi_hot", "count", "tf_idf")


def _whole(value: Any, who: str, what: str) -> int:
    """``value`` as a Python int where it is a whole number, else a ValueError naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer, float, np.floating)):
        raise ValueError(f"{who}: {what} must be an integer, got {value!r}")
    if not float(value).is_integer():
        raise ValueError(f"{who}: {what} must be an integer, got {value!r}")
    return int(value)


class IntegerLookup(Layer):
    """Each integer token replaced by its index in ``vocabulary`` (Keras's ``IntegerLookup`` with
    ``invert=False``), output as the indices (``output_mode="int"``) or encoded over the vocabulary's
    size as CategoryEncoding encodes (``"one_hot"``, ``"multi_hot"``, ``"count"``), or as the count
    times ``idf_weights`` (``"tf_idf"``).

    The indices, as Keras: ``mask_token`` (where set) first (index 0, in ``"int"`` mode only),
    then ``num_oov_indices`` out-of-vocabulary indices, then the vocabulary's tokens in order. A
    token outside the vocabulary takes the one OOV index, or with several ``floormod(token,
    num_oov_indices)`` of them (Keras's default ``oov_method``). Without OOV indices Keras raises for
    such a token; a device cannot, so malinn gives NaN there (the sample's every token where
    encoded). The mask token gives 0 in ``"int"`` mode and adds nothing to an encoding. Tokens
    arrive as float32 and are truncated toward zero, as Keras's cast to int64.

    Args:
        max_tokens: the largest vocabulary size, with the mask and OOV indices (None: any).
        num_oov_indices: out-of-vocabulary indices, 0 or more.
        mask_token: the token that stands for padding, or None.
        oov_token: the token Keras writes for the OOV indices when it lists the vocabulary (a
            vocabulary given with the mask and OOV tokens at its start, as Keras lists it, is read
            without them).
        vocabulary: the tokens, integers of at most 2^24 in magnitude, none twice.
        vocabulary_dtype: ``"int64"``.
        idf_weights: with ``output_mode="tf_idf"`` (and only then), one weight per token of
            ``vocabulary`` as given (the special tokens' too where it starts with them).
        invert: False (refused).
        output_mode: ``"int"``, ``"one_hot"``, ``"multi_hot"`` (``"binary"``), ``"count"`` or
            ``"tf_idf"`` (``"tf-idf"``).
        sparse: False.
        pad_to_max_tokens: encode over ``max_tokens`` rather than the vocabulary's size.
        oov_method: ``"floormod"`` (``"farmhash"`` hashes the token's digits: refused).
        salt: None (farmhash's).
        name: the layer's name.

    Raises:
        ValueError: an argument Keras refuses, no vocabulary, or an option malinn does not compute.
    """

    reusable_on_other_shapes = True
    keras_refused = {"StringLookup": STRING_REFUSAL, "TextVectorization": STRING_REFUSAL}
    #: ``"tf_idf"``: the padded inverse document frequencies, one per index of the encoding
    weight_names = ("idf_weights",)

    @classmethod
    def from_keras_config(cls, config: dict, keras: KerasContext) -> "IntegerLookup":
        """The layer of a Keras ``IntegerLookup`` config (its vocabulary in the config, or read from
        a ``.keras`` file's assets into it by the reader).

        Raises:
            NotConvertible: ``invert``, ``sparse``, farmhash, or no vocabulary.
        """
        mode = config.get("output_mode", "int")
        for refused, why in (
            (config.get("invert"), INVERT_REFUSAL),
            (config.get("sparse"), SPARSE_REFUSAL),
            (config.get("oov_method", "floormod") != "floormod", "oov_method 'farmhash' is not computed"),
        ):
            if refused:
                raise NotConvertible(f"with {why}")
        if config.get("vocabulary") is None:
            raise NotConvertible(
                "without its vocabulary: Keras keeps an adapted (or file) vocabulary in a .keras "
                "file's assets only (a .h5 file loses it); save the model as .keras, or give the "
                "layer its vocabulary as a list"
            )
        idf = config.get("idf_weights")
        if mode in ("tf_idf", "tf-idf") and idf is None:  # adapted: the file's weights hold them (padded)
            idf = [0.0] * len(np.asarray(config["vocabulary"], dtype=object).reshape(-1))
        layer = cls(
            max_tokens=config.get("max_tokens"),
            num_oov_indices=config.get("num_oov_indices", 1),
            mask_token=config.get("mask_token"),
            oov_token=config.get("oov_token", -1),
            vocabulary=config["vocabulary"],
            vocabulary_dtype=config.get("vocabulary_dtype", "int64"),
            output_mode=mode,
            idf_weights=idf,
            pad_to_max_tokens=bool(config.get("pad_to_max_tokens", False)),
            name=keras.name,
        )
        layer._idf_in_config = config.get("idf_weights") is not None
        return layer

    def from_keras_weights(self, weights: list) -> list:
        """The file's ``idf_weights`` (Keras's padded ones); a file without them: those of the config."""
        if self.output_mode == "tf_idf" and not weights and self._idf_in_config:
            return [self._padded_idf()]
        return list(weights)

    def __init__(
        self,
        max_tokens: int | None = None,
        num_oov_indices: int = 1,
        mask_token: int | None = None,
        oov_token: int | None = -1,
        vocabulary: Any = None,
        vocabulary_dtype: str = "int64",
        idf_weights: Any = None,
        invert: bool = False,
        output_mode: str = "int",
        sparse: bool = False,
        pad_to_max_tokens: bool = False,
        oov_method: str = "floormod",
        salt: Any = None,
        name: str | None = None,
    ):
        super().__init__(name)
        who = f"IntegerLookup {self.name!r}"
        if invert:
            raise ValueError(f"{who}: {INVERT_REFUSAL}")
        if sparse:
            raise ValueError(f"{who}: {SPARSE_REFUSAL}")
        if oov_method != "floormod" or salt is not None:
            raise ValueError(f"{who}: oov_method must be 'floormod' without a salt, got {oov_method!r}, salt {salt!r}")
        if vocabulary_dtype != "int64":
            raise ValueError(f"{who}: vocabulary_dtype must be 'int64', got {vocabulary_dtype!r}")
        tf_idf = output_mode in ("tf_idf", "tf-idf")
        self.output_mode = "int" if output_mode == "int" else "tf_idf" if tf_idf else encoding_mode(output_mode, who)
        if (idf_weights is not None) != tf_idf:
            raise ValueError(
                f"{who}: idf_weights are given with output_mode 'tf_idf' and only then, got output_mode "
                f"{output_mode!r} and idf_weights {'None' if idf_weights is None else 'set'}"
            )
        self.num_oov_indices = _whole(num_oov_indices, who, "num_oov_indices")
        if self.num_oov_indices < 0:
            raise ValueError(f"{who}: num_oov_indices must be >= 0, got {num_oov_indices!r}")
        self.max_tokens = None if max_tokens is None else _whole(max_tokens, who, "max_tokens")
        if self.max_tokens is not None and self.max_tokens <= 1:
            raise ValueError(f"{who}: max_tokens must be greater than 1, got {max_tokens!r}")
        self.pad_to_max_tokens = bool(pad_to_max_tokens)
        if self.pad_to_max_tokens and self.max_tokens is None:
            raise ValueError(f"{who}: pad_to_max_tokens needs max_tokens")
        self.mask_token = None if mask_token is None else _whole(mask_token, who, "mask_token")
        self.oov_token = None if oov_token is None else _whole(oov_token, who, "oov_token")
        self.tokens = self._tokens(vocabulary, who)
        self.input_idf_weights: list | None = None
        self._idf_in_config = idf_weights is not None
        self.idf_weights: np.ndarray | None = None
        if tf_idf:
            given = np.asarray(vocabulary, dtype=object).reshape(-1)
            try:
                idf = np.asarray(idf_weights, np.float64).reshape(-1)
            except (TypeError, ValueError):
                raise ValueError(f"{who}: idf_weights must be numbers, got {idf_weights!r}") from None
            if idf.size != given.size or np.asarray(idf_weights, dtype=object).ndim != 1:
                raise ValueError(
                    f"{who}: idf_weights must be one number per vocabulary token ({given.size}), got "
                    f"{np.asarray(idf_weights, dtype=object).shape}"
                )
            self.input_idf_weights = [float(v) for v in idf]
            self._special_given = given.size != len(self.tokens)

    def _tokens(self, vocabulary: Any, who: str) -> list:
        """The vocabulary's tokens, without the mask and OOV tokens Keras lists at its start, checked
        as Keras checks them (and exact in float32)."""
        if vocabulary is None or isinstance(vocabulary, (str, bytes)):
            raise ValueError(
                f"{who}: give the vocabulary as a list of integer tokens (malinn neither adapts the "
                f"layer nor reads a vocabulary file), got {vocabulary!r}"
            )
        values = [_whole(v, who, "each vocabulary token") for v in np.asarray(vocabulary, dtype=object).reshape(-1)]
        if not values:
            raise ValueError(f"{who}: the vocabulary is empty")
        special: list = [self.mask_token] * self.oov_start + [self.oov_token] * self.num_oov_indices
        tokens = values[len(special) :] if values[: len(special)] == special else values
        repeated = sorted(t for t, count in Counter(tokens).items() if count > 1)
        if repeated:
            raise ValueError(f"{who}: the vocabulary repeats tokens {repeated[:10]}")
        if self.mask_token is not None and self.mask_token in tokens:
            raise ValueError(f"{who}: the mask token {self.mask_token} is in the vocabulary")
        large = [t for t in tokens + ([] if self.mask_token is None else [self.mask_token]) if abs(t) > EXACT_TOKENS]
        if large:
            raise ValueError(
                f"{who}: tokens beyond 2^24 in magnitude ({large[:5]}) are not exact in float32, which "
                f"malinn computes in"
            )
        size = self.token_start + len(tokens)
        if self.max_tokens is not None and size > self.max_tokens:
            raise ValueError(f"{who}: a vocabulary of {size} indices is larger than max_tokens={self.max_tokens}")
        return tokens

    @property
    def oov_start(self) -> int:
        """The first OOV index: 1 after the mask's index 0 in ``"int"`` mode, else 0 (as Keras)."""
        return 1 if self.mask_token is not None and self.output_mode == "int" else 0

    @property
    def token_start(self) -> int:
        """The index of the vocabulary's first token."""
        return self.oov_start + self.num_oov_indices

    def vocabulary_size(self) -> int:
        """The number of indices: the mask's and the OOV indices, and the tokens (as Keras)."""
        return self.token_start + len(self.tokens)

    def get_vocabulary(self, include_special_tokens: bool = True) -> list:
        """The token of each index, as Keras lists it: the mask token (``"int"`` mode), the OOV token
        once per OOV index, then the vocabulary (only the vocabulary without the special tokens)."""
        special = [self.mask_token] * self.oov_start + [self.oov_token] * self.num_oov_indices
        return (special if include_special_tokens else []) + list(self.tokens)

    @property
    def depth(self) -> int:
        """The size of an encoding: ``max_tokens`` with ``pad_to_max_tokens``, else the vocabulary's."""
        return self.max_tokens if self.pad_to_max_tokens and self.max_tokens else self.vocabulary_size()

    def _padded_idf(self) -> np.ndarray:
        """Keras's idf weights of each index: those given, after the mean for the OOV indices where
        the vocabulary was given without them, zeros after up to :attr:`depth`."""
        idf = np.asarray(self.input_idf_weights, np.float64)
        front = [] if self._special_given else [float(np.average(idf)) if idf.size else 0.0] * self.token_start
        padded = np.concatenate([np.asarray(front, np.float64), idf])
        return np.pad(padded, (0, max(0, self.depth - padded.size))).astype(np.float32)

    def _encoding(self) -> str:
        """The encoding kernel's mode: a tf_idf's count, else the output mode."""
        return "count" if self.output_mode == "tf_idf" else self.output_mode

    def compute_output_shape(self, input_shape: Any) -> tuple:
        if self.output_mode == "int":
            if len(tuple(input_shape)) < 2:
                raise ValueError(f"IntegerLookup {self.name!r} expects inputs with a sample axis, got {input_shape}")
            return tuple(input_shape)
        check_encoded_rank(input_shape, self._encoding(), f"IntegerLookup {self.name!r}")
        return encoded_shape(input_shape, self.depth, self._encoding())

    def build(self, input_shape: Any) -> None:
        """Checks the input shape; with ``"tf_idf"``, sets :attr:`idf_weights` (``depth`` values,
        padded as Keras pads them)."""
        self.compute_output_shape(input_shape)
        super().build(input_shape)
        if self.output_mode == "tf_idf":
            self.idf_weights = self._padded_idf()

    def set_weights(self, weights: Any) -> None:
        """Sets ``[idf_weights]`` (``"tf_idf"``: one per index of the encoding, as Keras's variable);
        the other modes have no weights.

        Raises:
            ValueError: the layer is not built, or the count or shape differs.
        """
        weights = numeric_weights(weights, f"IntegerLookup {self.name!r}")
        want = [(self.depth,)] if self.output_mode == "tf_idf" else []
        if not self.built or [w.shape for w in weights] != want:
            raise ValueError(
                f"IntegerLookup {self.name!r}: takes weights of shapes {want} once built, got "
                f"{[w.shape for w in weights]}"
            )
        if weights:
            self.idf_weights = weights[0]
            self._weights_changed()

    def check_reuse(self, input_shape: Any, how: str = "receives") -> None:
        """An IntegerLookup looks up tokens of any shape it accepts: it has no weights."""
        self.compute_output_shape(input_shape)

    def lower(self, builder: PlanBuilder, x: Value) -> Value:
        order = np.argsort(np.asarray(self.tokens, np.float64), kind="stable")
        tokens = Vector(
            f"layer {self.name!r} vocabulary", np.asarray(self.tokens, np.float64)[order], self.device_copies
        )
        indices = Vector(
            f"layer {self.name!r} indices", (self.token_start + order).astype(np.float64), self.device_copies
        )
        defines = {
            "VOCAB": len(self.tokens),
            "OOV": self.num_oov_indices,
            "OOV_START": self.oov_start,
            "MASKING": int(self.mask_token is not None),
            "MASK_TOKEN": 0 if self.mask_token is None else self.mask_token,
            "MASK_INDEX": 0 if self.output_mode == "int" else self.depth,  # an encoding leaves it out
        }
        indices_out = kinds.integer_lookup(builder, x, tokens, indices, defines, self._what())
        if self.output_mode == "int":
            return indices_out
        out = kinds.category_encoding(builder, indices_out, self.depth, self._encoding(), self._what())
        if self.output_mode != "tf_idf":
            return out
        idf = Vector(f"layer {self.name!r} idf_weights", self.idf_weights, self.device_copies)
        zero = Vector(f"layer {self.name!r} idf shift", np.zeros(self.depth), self.device_copies)
        return kinds.affine(builder, out, idf, zero, what=self._what())

    def _config_vocabulary(self) -> list:
        """The tokens, after the special tokens where they begin as those do (read back without them)."""
        special = self.get_vocabulary()[: self.token_start]
        return special + list(self.tokens) if special and self.tokens[: len(special)] == special else list(self.tokens)

    def get_config(self) -> dict:
        return {
            **super().get_config(),
            "max_tokens": self.max_tokens,
            "num_oov_indices": self.num_oov_indices,
            "mask_token": self.mask_token,
            "oov_token": self.oov_token,
            # tf_idf weights given for the special tokens too: the vocabulary as given, with them
            "vocabulary": self.get_vocabulary() if self.__dict__.get("_special_given") else self._config_vocabulary(),
            "output_mode": self.output_mode,
            "pad_to_max_tokens": self.pad_to_max_tokens,
            **({"idf_weights": list(self.input_idf_weights)} if self.input_idf_weights is not None else {}),
        }
