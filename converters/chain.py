"""The structure of a saved Keras model, from its JSON config: which layers run, in what order.

Handles the config schemas of Keras 2 (``batch_input_shape``, Functional ``inbound_nodes`` as
``[[name, node, tensor, kwargs]]``, Keras 2.0-2.2 Sequential configs that are a bare list) and
Keras 3 (``batch_shape``, ``inbound_nodes`` as ``{"args": [...], "kwargs": {...}}`` holding
``__keras_tensor__`` references). Sequential models and Functional models that are a single
chain are accepted; nested Sequential/Functional models are flattened into the chain; a
Functional graph that branches, merges, shares a layer or has several inputs or outputs raises
:class:`~malinn.errors.ConversionError`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Union

from malinn.errors import ConversionError

SEQUENTIAL = "Sequential"
INPUT_LAYER = "InputLayer"


@dataclass
class LayerEntry:
    """A layer that is not a model: its class, name, config and the whole config entry."""

    class_name: str
    name: str
    config: dict[str, Any]
    entry: dict[str, Any]


@dataclass
class ModelNode:
    """A Sequential or Functional model (the top one or a nested one).

    ``members`` are in the order of Keras's ``model.layers`` (Sequential: without InputLayer;
    Functional: with it), the order Keras follows when it saves weights. ``chain`` holds
    indices into ``members`` in execution order, InputLayers left out.
    """

    class_name: str
    name: str
    config: dict[str, Any]
    members: list[Union["ModelNode", LayerEntry]] = field(default_factory=list)
    chain: list[int] = field(default_factory=list)
    input_shape: tuple | None = None
    kind: str = SEQUENTIAL
    entry: dict[str, Any] = field(default_factory=dict)


Member = Union[ModelNode, LayerEntry]


def _fail(source: str, message: str) -> ConversionError:
    return ConversionError(f"{source}: {message}")


def parse_model(entry: Any, source: str, where: str = "the model config") -> ModelNode:
    """Parse ``{"class_name": ..., "config": ...}`` of a Sequential or Functional model."""
    if not isinstance(entry, dict):
        raise _fail(source, f"{where} is not a JSON object (got {type(entry).__name__})")
    class_name = entry.get("class_name")
    cfg = entry.get("config")
    if not isinstance(class_name, str):
        raise _fail(source, f"{where} has no class_name")
    if isinstance(cfg, list):  # Keras 2.0-2.2 Sequential: config is the list of layers.
        node = _parse_sequential(class_name, None, {"layers": cfg}, cfg, source)
        node.entry = entry
        return node
    if not isinstance(cfg, dict):
        raise _fail(source, f"{where} ({class_name}) has no config object")
    name = cfg.get("name") if isinstance(cfg.get("name"), str) else entry.get("name")
    layers = cfg.get("layers")
    if isinstance(layers, list):
        # A Sequential or Functional model (or a custom subclass of one: provenance.py refuses
        # those, since their own call is not in the file).
        if "input_layers" in cfg or "output_layers" in cfg:
            node = _parse_functional(class_name, name, cfg, layers, source)
        else:
            node = _parse_sequential(class_name, name, cfg, layers, source)
        node.entry = entry
        return node
    raise _fail(
        source,
        f"{where} describes a {class_name!r}, which is neither a Sequential nor a Functional "
        "model (a subclassed model does not store its structure in the file; rebuild it as "
        "a Sequential or Functional model before saving)",
    )


def _is_model_entry(entry: dict) -> bool:
    cfg = entry.get("config")
    if isinstance(cfg, list):
        return entry.get("class_name") == SEQUENTIAL
    return isinstance(cfg, dict) and isinstance(cfg.get("layers"), list)


def _parse_member(entry: Any, index: int, model_name: str | None, source: str) -> Member:
    where = f"layer #{index} of model {model_name!r}"
    if not isinstance(entry, dict):
        raise _fail(source, f"{where} is not a JSON object")
    class_name = entry.get("class_name")
    if not isinstance(class_name, str) or not class_name:
        raise _fail(source, f"{where} has no class_name")
    if _is_model_entry(entry):
        return parse_model(entry, source, where=where)
    cfg = entry.get("config")
    if cfg is None:
        cfg = {}
    if not isinstance(cfg, dict):
        raise _fail(source, f"{where} ({class_name}) has a config that is not a JSON object")
    name = cfg.get("name") if isinstance(cfg.get("name"), str) else entry.get("name")
    if not isinstance(name, str) or not name:
        raise _fail(source, f"{where} ({class_name}) has no name")
    return LayerEntry(class_name=class_name, name=name, config=cfg, entry=entry)


def _shape_list(value: Any) -> tuple | None:
    """A shape written as a flat list of ints/None, as a tuple; anything else gives None."""
    if isinstance(value, (list, tuple)) and all(
        v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in value
    ):
        return tuple(value)
    return None


def input_layer_shape(cfg: dict) -> tuple | None:
    """The shape (no batch dimension) an InputLayer config declares."""
    for key in ("batch_shape", "batch_input_shape"):
        shape = _shape_list(cfg.get(key))
        if shape is not None and len(shape) >= 1:
            return shape[1:]
    shape = _shape_list(cfg.get("shape"))
    return shape


def _first_layer_shape(entry: dict) -> tuple | None:
    cfg = entry.get("config") if isinstance(entry.get("config"), dict) else {}
    for key in ("batch_input_shape", "batch_shape"):
        shape = _shape_list(cfg.get(key))
        if shape:
            return shape[1:]
    build = entry.get("build_config")
    if isinstance(build, dict):
        shape = _shape_list(build.get("input_shape"))
        if shape:
            return shape[1:]
    return None


def _parse_sequential(class_name, name, cfg, layers, source) -> ModelNode:
    node = ModelNode(class_name=class_name, name=name or "sequential", config=cfg, kind=SEQUENTIAL)
    input_shape = None
    for i, raw in enumerate(layers):
        member = _parse_member(raw, i, node.name, source)
        if isinstance(member, LayerEntry) and member.class_name == INPUT_LAYER:
            if input_shape is None:
                input_shape = input_layer_shape(member.config)
            continue  # Sequential.layers leaves the InputLayer out.
        node.members.append(member)
    node.chain = list(range(len(node.members)))
    if input_shape is None:
        shape = _shape_list(cfg.get("build_input_shape"))
        if shape:
            input_shape = shape[1:]
    if input_shape is None and layers and isinstance(layers[0], dict):
        input_shape = _first_layer_shape(layers[0])
    node.input_shape = input_shape
    return node


def _tensor_refs(obj: Any, out: list) -> None:
    """Collect ``keras_history`` of every ``__keras_tensor__`` inside a Keras 3 node."""
    if isinstance(obj, dict):
        if obj.get("class_name") == "__keras_tensor__":
            history = (obj.get("config") or {}).get("keras_history")
            if isinstance(history, list) and history:
                out.append(tuple(history[:3]))
            return
        for value in obj.values():
            _tensor_refs(value, out)
    elif isinstance(obj, list):
        for value in obj:
            _tensor_refs(value, out)


def node_inputs(node: Any) -> list[tuple]:
    """The ``(layer name, node index, tensor index)`` a node of ``inbound_nodes`` reads."""
    refs: list[tuple] = []
    if isinstance(node, dict):  # Keras 3
        _tensor_refs({"args": node.get("args"), "kwargs": node.get("kwargs")}, refs)
    elif isinstance(node, list):  # Keras 2: [[name, node_index, tensor_index, kwargs], ...]
        for item in node:
            if isinstance(item, list) and item and isinstance(item[0], str):
                refs.append(tuple(item[:3]))
            else:
                _tensor_refs(item, refs)
    return refs


def _endpoints(value: Any) -> list[tuple]:
    """``input_layers`` / ``output_layers``: one ``[name, 0, 0]`` or a list of them."""
    if isinstance(value, list) and value and isinstance(value[0], str):
        return [tuple(value[:3])]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        out = []
        for item in value:
            out.extend(_endpoints(item))
        return out
    return []


def _parse_functional(class_name, name, cfg, layers, source) -> ModelNode:
    node = ModelNode(class_name=class_name, name=name or "model", config=cfg, kind="Functional")
    label = f"Functional model {node.name!r}"
    not_chain = f"{label} is not a single chain of layers (it branches)"
    by_name: dict[str, int] = {}
    for i, raw in enumerate(layers):
        member = _parse_member(raw, i, node.name, source)
        if member.name in by_name:
            raise _fail(source, f"{label} has two layers named {member.name!r}")
        by_name[member.name] = len(node.members)
        node.members.append(member)

    inputs = _endpoints(cfg.get("input_layers"))
    outputs = _endpoints(cfg.get("output_layers"))
    if not inputs or not outputs:
        raise _fail(source, f"{label} does not name its input and output layers")
    if len(inputs) != 1:
        names = ", ".join(repr(r[0]) for r in inputs)
        raise _fail(source, f"{not_chain}: it has {len(inputs)} inputs ({names})")
    if len(outputs) != 1:
        names = ", ".join(repr(r[0]) for r in outputs)
        raise _fail(source, f"{not_chain}: it has {len(outputs)} outputs ({names})")
    input_name, output_name = inputs[0][0], outputs[0][0]
    for end in (input_name, output_name):
        if end not in by_name:
            raise _fail(
                source, f"{label} names {end!r} as an input or output, but has no such layer"
            )
    first = node.members[by_name[input_name]]
    if not (isinstance(first, LayerEntry) and first.class_name == INPUT_LAYER):
        raise _fail(source, f"{label}: its input {input_name!r} is not an InputLayer")

    consumers: dict[str, list[str]] = {n: [] for n in by_name}
    body = []
    for member in node.members:
        raw = member.entry if isinstance(member, LayerEntry) else None
        if isinstance(member, LayerEntry) and member.class_name == INPUT_LAYER:
            if member.name != input_name:
                raise _fail(source, f"{not_chain}: it has a second input {member.name!r}")
            continue
        body.append(member.name)
        if raw is None:
            raw = _raw_entry(layers, member.name)
        nodes = raw.get("inbound_nodes") if isinstance(raw, dict) else None
        if not isinstance(nodes, list) or not nodes:
            raise _fail(source, f"{label}: layer {member.name!r} has no inbound connection")
        if len(nodes) > 1:
            raise _fail(
                source,
                f"{not_chain}: layer {member.name!r} is called {len(nodes)} times (a shared layer)",
            )
        refs = node_inputs(nodes[0])
        if len(refs) != 1:
            srcs = ", ".join(repr(r[0]) for r in refs) or "none"
            raise _fail(
                source,
                f"{not_chain}: layer {member.name!r} takes {len(refs)} inputs ({srcs})",
            )
        src = refs[0][0]
        if src not in by_name:
            raise _fail(source, f"{label}: layer {member.name!r} reads from unknown layer {src!r}")
        if any(isinstance(v, int) and v != 0 for v in refs[0][1:]):
            raise _fail(
                source,
                f"{not_chain}: layer {member.name!r} reads output {list(refs[0][1:])} of {src!r}",
            )
        consumers[src].append(member.name)

    for src, users in consumers.items():
        if len(users) > 1:
            names = ", ".join(repr(u) for u in users)
            raise _fail(
                source, f"{not_chain}: the output of {src!r} feeds {len(users)} layers ({names})"
            )

    order = []
    current = input_name
    while consumers[current]:
        current = consumers[current][0]
        order.append(current)
    if current != output_name:
        raise _fail(
            source,
            f"{not_chain}: following the chain from {input_name!r} ends at {current!r}, "
            f"not at the output {output_name!r}",
        )
    missing = [n for n in body if n not in order]
    if missing:
        raise _fail(source, f"{not_chain}: layers off the input-output path: {', '.join(missing)}")
    node.chain = [by_name[n] for n in order]
    node.input_shape = input_layer_shape(first.config)
    return node


def _raw_entry(layers: list, name: str) -> dict | None:
    for raw in layers:
        if isinstance(raw, dict):
            cfg = raw.get("config") if isinstance(raw.get("config"), dict) else {}
            if raw.get("name") == name or cfg.get("name") == name:
                return raw
    return None


def iter_chain(node: ModelNode, trail: tuple = ()) -> Iterator[tuple[LayerEntry, tuple]]:
    """Leaf layers in execution order, each with its trail ``((model, member index), ...)``."""
    for index in node.chain:
        member = node.members[index]
        step = trail + ((node, index),)
        if isinstance(member, ModelNode):
            yield from iter_chain(member, step)
        else:
            yield member, step


def iter_leaves(node: ModelNode) -> Iterator[LayerEntry]:
    """Every non-Input leaf layer under ``node`` (any order)."""
    for member in node.members:
        if isinstance(member, ModelNode):
            yield from iter_leaves(member)
        elif member.class_name != INPUT_LAYER:
            yield member
