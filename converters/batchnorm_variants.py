"""tf_keras's variants of BatchNormalization in a file, read as the plain layer they are at inference.

``renorm=True`` (batch renormalization) adds ``renorm_mean``, ``renorm_stddev`` and
``moving_stddev`` to gamma, beta, moving_mean and moving_variance; at inference Keras normalizes
with the moving statistics alone (``training=False``), so the extra arrays are dropped, told apart
by the names the file gives them (an archive's ``vars/0``... in the order tf_keras makes them: those
four first). ``virtual_batch_size=V`` (ghost batch normalization) stores each
array between axes of 1 (``(1, 1, C)`` on the last axis), which broadcast against the virtual batches, and
its config's ``axis`` counts the axis it inserts in front (a built layer's: ``[2]`` for inputs of
shape ``(batch, C)``); at inference it is a plain BatchNormalization, so the arrays are read as
vectors and the axis one less.
"""

from __future__ import annotations

from malinn.errors import ConversionError

from .model_spec import KerasLayer, KerasModel

#: what Keras normalizes with at inference, in its weights' order
_INFERENCE_ROLES = ("gamma", "beta", "moving_mean", "moving_variance")
#: batch renormalization's own arrays (training only)
_RENORM_ROLES = ("renorm_mean", "renorm_stddev", "moving_stddev")


def resolve_batchnorm_variants(model: KerasModel) -> None:
    """Drops batch renormalization's arrays and reads ghost batch normalization's as vectors, in place.

    Raises:
        ConversionError: a renormalizing layer whose arrays cannot be told apart by name; a ghost
            one whose arrays are not vectors once the axes of 1 are dropped.
    """
    for layer in model.layers:
        if layer.class_name != "BatchNormalization":
            continue
        if layer.config.get("renorm"):
            _drop_renorm(model.source, layer)
        if layer.config.get("virtual_batch_size"):
            _squeeze_ghost(model.source, layer)


def _role(weight_name: str) -> str:
    """``"bn/bn/moving_mean:0"`` -> ``"moving_mean"``."""
    return weight_name.rsplit("/", 1)[-1].split(":", 1)[0]


def _drop_renorm(source: str, layer: KerasLayer) -> None:
    roles = [_role(name) for name in layer.weight_names]
    if roles and all(role.isdigit() for role in roles):  # an archive's vars/0..: the order tf_keras builds them
        flags = {
            "gamma": layer.config.get("scale", True) is not False,
            "beta": layer.config.get("center", True) is not False,
        }
        roles = [r for r in _INFERENCE_ROLES if flags.get(r, True)] + list(_RENORM_ROLES)
    known = set(_INFERENCE_ROLES) | set(_RENORM_ROLES)
    if len(roles) != len(layer.weights) or not set(roles) <= known or len(set(roles)) != len(roles):
        raise ConversionError(
            f"{source}: layer {layer.name!r}: BatchNormalization with renorm=True: its "
            f"{len(layer.weights)} weight arrays ({', '.join(layer.weight_names) or 'unnamed'}) "
            f"cannot be told apart by name; expected {', '.join(_INFERENCE_ROLES + _RENORM_ROLES)}"
        )
    kept = [i for i, role in enumerate(roles) if role in _INFERENCE_ROLES]
    layer.weights = [layer.weights[i] for i in kept]
    layer.weight_names = [layer.weight_names[i] for i in kept]


def _squeeze_ghost(source: str, layer: KerasLayer) -> None:
    if any(sum(d != 1 for d in w.shape) > 1 for w in layer.weights):
        shapes = ", ".join(str(tuple(w.shape)) for w in layer.weights)
        raise ConversionError(
            f"{source}: layer {layer.name!r}: BatchNormalization with virtual_batch_size: "
            f"expected arrays of C values between axes of 1 (e.g. (1, 1, C)), got {shapes}"
        )
    squeezed = [w.reshape(-1) for w in layer.weights]
    layer.weights = squeezed
    axis = layer.config.get("axis", -1)
    axes = axis if isinstance(axis, list) else [axis]
    if not all(isinstance(a, int) and not isinstance(a, bool) and a >= 2 for a in axes):
        raise ConversionError(
            f"{source}: layer {layer.name!r}: BatchNormalization with virtual_batch_size: "
            f"axis {axis!r} is not the built layer's (an axis after the virtual batch's, >= 2)"
        )
    shifted = [a - 1 for a in axes]
    layer.config = {**layer.config, "axis": shifted if isinstance(axis, list) else shifted[0]}
