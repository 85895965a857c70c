"""The structure of a saved Keras model, from its JSON config: which layers run, in what order.

Handles the config schemas of Keras 2 (``batch_input_shape``, Functional ``inbound_nodes`` as
``[[name, node, tensor, kwargs]]``, Keras 2.0-2.2 Sequential configs that are a bare list) and
Keras 3 (``batch_shape``, ``inbound_nodes`` as ``{"args": [...], "kwargs": {...}}`` holding
``__keras_tensor__`` references). Sequential models and Functional models of any graph shape are
accepted: a single chain (nested models flattened into it) is listed in execution order
(``ModelNode.chain``); any other graph, with its merges, shared layers, several inputs and outputs,
is expanded into calls of leaf layers by :func:`expand_graph`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Union

from malinn.errors import ConversionError

from .model_spec import KerasCall, KerasGraph

SEQUENTIAL = "Sequential"
INPUT_LAYER = "InputLayer"
#: how deep models may nest in one another (Keras models nest a few deep; the walks over nested
#: models recurse once per level, so this keeps them far from Python's recursion limit)
MAX_NESTED_MODELS = 100


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
    #: Functional only: the InputLayer names, the output references ``(name, node, tensor)``, and
    #: per member the references each of its calls reads (one list per inbound node)
    inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    calls: dict = field(default_factory=dict)
    output_names: list | None = None
    #: Functional only: the keys of Keras 3's inputs given as a dict (``Model({"alpha": x}, ...)``),
    #: which Keras's predict takes, in the order of ``inputs``; None where they are a list
    input_keys: list | None = None
    #: Functional only: Keras 3 operators called with a constant operand (``x * 2.0``), as
    #: ``(member name, call index) -> the constant as shown``; the graph's call carries it
    #: (:attr:`~converters.model_spec.KerasCall.constant`) and the converter lists it as unsupported
    constants: dict = field(default_factory=dict)
    #: Functional only: ``(member name, call index) -> operator arguments`` of the operators called with
    #: a constant or options (:func:`operator_arguments`), which the graph's call carries
    operands: dict = field(default_factory=dict)
    #: Functional only: the ``(member name, call index)`` of tf_keras calls given ``training=True``
    #: (Monte Carlo dropout, an augmentation or a BatchNormalization forced into training in predict)
    training: set = field(default_factory=set)
    #: Functional only: ``(member name, call index) -> (argument of each reference, other arguments)``
    #: of the calls that pass tensors by keyword or options (:func:`node_arguments`)
    arguments: dict = field(default_factory=dict)
    #: Functional only: whether its references are Keras 3's (``__keras_tensor__`` objects), which
    #: number a nested model's calls otherwise than tf_keras's (:func:`_node_offsets`)
    keras3: bool = False


Member = Union[ModelNode, LayerEntry]


def _fail(source: str, message: str) -> ConversionError:
    return ConversionError(f"{source}: {message}")


def parse_model(entry: Any, source: str, where: str = "the model config", depth: int = 0) -> ModelNode:
    """Parse ``{"class_name": ..., "config": ...}`` of a Sequential or Functional model (``depth``: how
    many models hold it; more than :data:`MAX_NESTED_MODELS` is refused)."""
    if not isinstance(entry, dict):
        raise _fail(source, f"{where} is not a JSON object (got {type(entry).__name__})")
    if depth > MAX_NESTED_MODELS:
        raise _fail(
            source,
            f"{where} is a model nested {depth} models deep, more than malinn reads "
            f"({MAX_NESTED_MODELS}); flatten the model before saving it",
        )
    class_name = entry.get("class_name")
    cfg = entry.get("config")
    if not isinstance(class_name, str):
        raise _fail(source, f"{where} has no class_name")
    if isinstance(cfg, list):  # Keras 2.0-2.2 Sequential: config is the list of layers.
        node = _parse_sequential(class_name, None, {"layers": cfg}, cfg, source, depth)
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
            node = _parse_functional(class_name, name, cfg, layers, source, depth)
        else:
            node = _parse_sequential(class_name, name, cfg, layers, source, depth)
        node.entry = entry
        return node
    if "layers" in cfg:
        raise _fail(
            source,
            f"{where} ({class_name}) has 'layers' that is not a list "
            f"(got {type(layers).__name__}): the file is damaged",
        )
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


def _parse_member(entry: Any, index: int, model_name: str | None, source: str, depth: int) -> Member:
    where = f"layer #{index} of model {model_name!r}"
    if not isinstance(entry, dict):
        raise _fail(source, f"{where} is not a JSON object")
    class_name = entry.get("class_name")
    if not isinstance(class_name, str) or not class_name:
        raise _fail(source, f"{where} has no class_name")
    if _is_model_entry(entry):
        return parse_model(entry, source, where=where, depth=depth + 1)
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
    given = entry.get("config")
    cfg = given if isinstance(given, dict) else {}
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


def _parse_sequential(class_name: str, name: Any, cfg: dict, layers: list, source: str, depth: int) -> ModelNode:
    node = ModelNode(class_name=class_name, name=name or "sequential", config=cfg, kind=SEQUENTIAL)
    input_shape = None
    for i, raw in enumerate(layers):
        member = _parse_member(raw, i, node.name, source, depth)
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


def _constant_operand(node: Any) -> int | float | str | None:
    """The first constant among a Keras 3 node's positional arguments, else None: a number (``x * 2.0``
    saves 2.0 there beside the tensor), or an array (``x + np.array(...)`` saves a ``__numpy__``
    object; anything serialised that is not a ``__keras_tensor__``), shown by its class name."""
    args = node.get("args") if isinstance(node, dict) else None
    for value in args if isinstance(args, list) else []:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
        if isinstance(value, dict) and "class_name" in value and value["class_name"] != "__keras_tensor__":
            return f"a {str(value['class_name']).strip('_')} constant"
    return None


#: tf_keras's reference to a constant first operand of a TFOpLambda (``2.0 - x``)
CONSTANT_VALUE = "_CONSTANT_VALUE"
#: the keyword arguments of a TFOpLambda call that change nothing it computes
_TF_OP_IGNORED = ("name",)


def _constant_value(value: Any) -> Any:
    """A constant operand as plain data (a number, or nested lists of them), or None where it is a
    tensor reference or something else."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    if isinstance(value, dict) and value.get("class_name") in ("__numpy__", "__tensor__"):
        inner = (value.get("config") or {}).get("value")
        return inner if isinstance(inner, (int, float, list)) and not isinstance(inner, bool) else None
    if isinstance(value, list) and value and not (isinstance(value[0], str)):
        refs: list = []
        _tensor_refs_keras2(value, refs)
        _tensor_refs(value, refs)  # Keras 3's list of tensors (the operation ``concatenate([a, b])``)
        return None if refs else value
    return None


def operator_arguments(member: LayerEntry, node: Any) -> dict | None:
    """What an operator's call takes besides its tensors, where it takes anything: ``{"constant":
    value or None, "first": whether the constant is the first operand, "options": other keyword
    arguments}``; None for a call of tensors alone (or of a layer that is no operator).

    Keras 3 writes an operation's constant among the node's ``args`` (``[tensor, 3.0]``, an array as a
    ``__numpy__`` object); tf_keras's TFOpLambda as its ``y`` keyword, or first ``[_CONSTANT_VALUE,
    -1, value, kwargs]``, and its other keywords (``axis``, ``approximate``) beside."""
    if member.class_name == "TFOpLambda" and isinstance(node, list) and node and isinstance(node[0], str):
        kwargs = dict(node[3]) if len(node) > 3 and isinstance(node[3], dict) else {}
        constant, first = None, node[0] == CONSTANT_VALUE
        if first:
            constant = _constant_value(node[2] if len(node) > 2 else None)
        elif "y" in kwargs and _constant_value(kwargs["y"]) is not None:
            constant = _constant_value(kwargs["y"])
        if constant is not None or first:
            kwargs.pop("y", None)
        options = {k: v for k, v in kwargs.items() if k not in _TF_OP_IGNORED and k != "y"}
        if constant is None and not first and not options:
            return None
        return {"constant": constant, "first": first, "options": options}
    if is_operation(member) and isinstance(node, dict):
        args = node.get("args")
        for i, value in enumerate(args if isinstance(args, list) else []):
            constant = _constant_value(value)
            if constant is not None:
                return {"constant": constant, "first": i == 0, "options": {}}
    return None


def _record_operators(node: ModelNode, member: Member, nodes: list) -> None:
    """The constant operands of ``member``'s calls (a Keras 3 operation's, shown in messages) and the
    arguments of its operator calls (:func:`operator_arguments`)."""
    if not isinstance(member, LayerEntry):
        return
    for k, (n, refs) in enumerate(zip(nodes, node.calls[member.name])):
        if is_operation(member):
            constant = _constant_operand(n)
            if constant is not None and len(refs) < 2:
                node.constants[(member.name, k)] = constant if isinstance(constant, str) else repr(constant)
        arguments = operator_arguments(member, n)
        if arguments is not None:
            node.operands[(member.name, k)] = arguments
            node.constants.setdefault(
                (member.name, k), repr(arguments["constant"]) if arguments["constant"] is not None else "options"
            )


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


def called_in_training(node: Any) -> bool:
    """Whether a tf_keras node of ``inbound_nodes`` passed ``training=True`` (the kwargs after each
    reference), which tf_keras's predict honours: its training behaviour runs there. Keras 3 records
    ``training`` in a node's ``kwargs`` too (also the default of a layer's ``call``: RandomFlip's is
    True), but its predict passes ``training=False`` over it: never a training call."""
    if isinstance(node, dict):
        return False
    if isinstance(node, list) and node and isinstance(node[0], str):
        node = [node]
    return any(
        isinstance(item, list) and len(item) > 3 and isinstance(item[3], dict) and item[3].get("training") is True
        for item in node
        if isinstance(node, list)
    )


def _argument_paths(obj: Any, path: str, roles: list, options: dict) -> None:
    """The argument path (``"0"``, ``"0.1"``, ``"key"``, ``"mask.1"``) of each ``__keras_tensor__``
    inside a Keras 3 argument, in :func:`_tensor_refs`'s order; plain values into ``options``."""
    if isinstance(obj, dict) and obj.get("class_name") == "__keras_tensor__":
        roles.append(path)
    elif isinstance(obj, list) and any(isinstance(v, (dict, list)) for v in obj):
        for i, value in enumerate(obj):
            _argument_paths(value, f"{path}.{i}", roles, options)
    elif path.count(".") == 0 and not path.isdigit():
        options[path] = obj


def node_arguments(node: Any) -> tuple:
    """``(argument of each reference :func:`node_inputs` lists, the call's other keyword arguments)``
    of a node of ``inbound_nodes``: positional arguments by index (``"0"``; ``"0.1"`` the second
    tensor of a list), keyword arguments by name (``"attention_mask"``, ``"mask.1"``), so a layer
    whose call takes several tensors (MultiHeadAttention's query, value, key, attention_mask) knows
    which is which."""
    roles: list = []
    options: dict = {}
    if isinstance(node, dict):  # Keras 3
        for i, value in enumerate(node.get("args") or []):
            _argument_paths(value, str(i), roles, options)
        for name, value in (node.get("kwargs") or {}).items():
            _argument_paths(value, str(name), roles, options)
    elif isinstance(node, list) and node and not isinstance(node[0], str):  # Keras 2: one item per tensor
        items = [item for item in node if isinstance(item, list) and item and isinstance(item[0], str)]
        for i, item in enumerate(items):
            roles.append("0" if len(items) == 1 else f"0.{i}")
            for name, value in (item[3] if len(item) > 3 and isinstance(item[3], dict) else {}).items():
                refs: list = []
                _tensor_refs_keras2(value, refs)
                if refs:
                    roles += (
                        [str(name)]
                        if len(refs) == 1 and not isinstance(value[0], list)
                        else [f"{name}.{j}" for j in range(len(refs))]
                    )
                else:
                    options[str(name)] = value
    return roles, options


def _tensor_refs_keras2(obj: Any, out: list) -> None:
    """The ``[name, node, tensor]`` references inside a Keras 2 call's keyword argument."""
    if isinstance(obj, list) and len(obj) >= 3 and isinstance(obj[0], str) and isinstance(obj[1], int):
        out.append(tuple(obj[:3]))
    elif isinstance(obj, list):
        for value in obj:
            _tensor_refs_keras2(value, out)


def node_inputs(node: Any) -> list[tuple]:
    """The ``(layer name, node index, tensor index)`` a node of ``inbound_nodes`` reads."""
    refs: list[tuple] = []
    if isinstance(node, dict):  # Keras 3
        _tensor_refs({"args": node.get("args"), "kwargs": node.get("kwargs")}, refs)
    elif isinstance(node, list) and node and isinstance(node[0], str):
        # tf_keras's TFOpLambda: one flat reference [name, node_index, tensor_index, kwargs], whose
        # kwargs may name the operation's other tensor ({"y": [name, 0, 0]}); a constant first
        # operand (2.0 - x) is written [_CONSTANT_VALUE, -1, value, kwargs]
        if node[0] != CONSTANT_VALUE:
            refs.append(tuple(node[:3]))
        if len(node) > 3:
            _tensor_refs(node[3], refs)
            for value in node[3].values() if isinstance(node[3], dict) else ():
                _tensor_refs_keras2(value, refs)
    elif isinstance(node, list):  # Keras 2: [[name, node_index, tensor_index, kwargs], ...]
        for item in node:
            if isinstance(item, list) and item and isinstance(item[0], str):
                refs.append(tuple(item[:3]))
                if len(item) > 3 and isinstance(item[3], dict):  # tensors passed by keyword (a value, a mask)
                    for value in item[3].values():
                        _tensor_refs_keras2(value, refs)
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


def _parse_functional(class_name: str, name: Any, cfg: dict, layers: list, source: str, depth: int) -> ModelNode:
    node = ModelNode(class_name=class_name, name=name or "model", config=cfg, kind="Functional")
    label = f"Functional model {node.name!r}"
    by_name: dict[str, int] = {}
    for i, raw in enumerate(layers):
        member = _parse_member(raw, i, node.name, source, depth)
        if member.name in by_name:
            raise _fail(source, f"{label} has two layers named {member.name!r}")
        by_name[member.name] = len(node.members)
        node.members.append(member)

    inputs = _endpoints(cfg.get("input_layers"))
    outputs = _endpoints(cfg.get("output_layers"))
    if not inputs or not outputs:
        raise _fail(source, f"{label} does not name its input and output layers")
    for end in [r[0] for r in inputs + outputs]:
        if end not in by_name:
            raise _fail(source, f"{label} names {end!r} as an input or output, but has no such layer")
    for ref in inputs:
        first = node.members[by_name[ref[0]]]
        if not (isinstance(first, LayerEntry) and first.class_name == INPUT_LAYER):
            raise _fail(source, f"{label}: its input {ref[0]!r} is not an InputLayer")
    named = cfg.get("input_layers")
    if isinstance(named, dict) and len(named) == len(inputs):
        # Keras 3: inputs given as a dict, which its predict takes by key; Keras flattens a dict in
        # the order of its sorted keys (model.inputs, and a list given to predict)
        pairs = sorted(zip([str(k) for k in named], inputs), key=lambda pair: pair[0])
        node.input_keys, inputs = [k for k, _ in pairs], [r for _, r in pairs]
    node.inputs, node.outputs = [r[0] for r in inputs], [tuple(r) for r in outputs]
    named = cfg.get("output_layers")
    if isinstance(named, dict) and len(named) == len(outputs):  # Keras 3: outputs given as a dict
        node.output_names = [str(k) for k in named]
    for member in node.members:
        if isinstance(member, LayerEntry) and member.class_name == INPUT_LAYER:
            if member.name not in node.inputs:
                raise _fail(source, f"{label}: InputLayer {member.name!r} is not among its inputs")
            continue
        nodes = member.entry.get("inbound_nodes")
        if not isinstance(nodes, list) or not nodes:
            raise _fail(source, f"{label}: layer {member.name!r} has no inbound connection")
        node.calls[member.name] = [node_inputs(n) for n in nodes]
        node.training |= {(member.name, k) for k, n in enumerate(nodes) if called_in_training(n)}
        for k, n in enumerate(nodes):
            roles, options = node_arguments(n)
            if len(roles) == len(node.calls[member.name][k]) and (any(not r.isdigit() for r in roles) or options):
                node.arguments[(member.name, k)] = (tuple(roles), options)
        node.keras3 = node.keras3 or any(isinstance(n, dict) for n in nodes)
        _record_operators(node, member, nodes)
        for refs in node.calls[member.name]:
            for ref in refs:
                if ref[0] not in by_name:
                    raise _fail(source, f"{label}: layer {member.name!r} reads from unknown layer {ref[0]!r}")
    node.chain = _chain(node, by_name)
    first = node.members[by_name[node.inputs[0]]]
    node.input_shape = input_layer_shape(first.config)
    return node


def _chain(node: ModelNode, by_name: dict) -> list[int]:
    """The members in execution order where the model is a single chain (each layer called once on
    the one before it), else ``[]``: the graph then says the order (:func:`expand_graph`)."""
    if len(node.inputs) != 1 or len(node.outputs) != 1:
        return []
    consumers: dict[str, list[str]] = {n: [] for n in by_name}
    for name, calls in node.calls.items():
        if len(calls) != 1 or len(calls[0]) != 1 or any(isinstance(v, int) and v != 0 for v in calls[0][0][1:]):
            return []
        consumers[calls[0][0][0]].append(name)
    if any(len(users) > 1 for users in consumers.values()):
        return []
    order, current = [], node.inputs[0]
    while consumers[current]:
        current = consumers[current][0]
        order.append(current)
    if current != node.outputs[0][0] or len(order) != len(node.calls):
        return []
    return [by_name[n] for n in order]


#: the outputs a leaf layer's call may have (a Bidirectional LSTM with return_state: the output and four
#: states); output i > 0 of call tensor ``t`` is named ``t@i``
_MAX_LEAF_OUTPUTS = 8


def expand_graph(root: ModelNode, source: str, names: dict | None = None) -> KerasGraph:
    """The model as one graph of leaf-layer calls, nested models expanded (each call of a nested
    model expands again: its layers are then shared). ``names``: ``id(leaf) -> the name its calls
    give it`` (:func:`leaf_names`); a leaf not in it is called by its own name.

    tf_keras numbers a nested model's calls from 1 when the model has an InputLayer of its own
    (its first node is that input), Keras 3 from 0; the numbering is recognised from the
    references themselves.

    Returns:
        A :class:`~malinn.converters.model_spec.KerasGraph`.

    Raises:
        ConversionError: a reference names a call or output that does not exist, or the graph has
            a cycle.
    """
    calls: list = []
    counter = [0]

    def new_tensor(label: str) -> str:
        counter[0] += 1
        return f"{label}#{counter[0]}"

    def call_leaf(
        leaf: LayerEntry,
        ins: list,
        listed: bool,
        constant: str | None = None,
        training: bool = False,
        arguments: tuple = ((), {}),
        operand: dict | None = None,
    ) -> str:
        name = (names or {}).get(id(leaf), leaf.name)
        out = new_tensor(name)
        calls.append(
            KerasCall(
                layer=name,
                inputs=list(ins),
                output=out,
                listed=listed,
                constant=constant,
                training=training,
                arguments=arguments[0],
                options=arguments[1],
                operand=operand,
            )
        )
        return out

    def expand(model: ModelNode, ins: list, training: bool = False) -> list:
        """``model``'s calls on ``ins`` (``training``: called with ``training=True``, which its layers
        take on)."""
        if model.kind == SEQUENTIAL:
            if len(ins) != 1:
                raise _fail(source, f"Sequential model {model.name!r} is called on {len(ins)} tensors")
            t = ins[0]
            for index in model.chain:
                member = model.members[index]
                t = (
                    expand(member, [t], training)[0]
                    if isinstance(member, ModelNode)
                    else call_leaf(member, [t], False, training=training)
                )
            return [t]
        label = f"Functional model {model.name!r}"
        if len(ins) != len(model.inputs):
            raise _fail(source, f"{label} takes {len(model.inputs)} inputs, but is called on {len(ins)}")
        by_name = {m.name: m for m in model.members}
        called_from, output_from = _node_offsets(model, by_name)
        made: dict = {(name, 0, 0): t for name, t in zip(model.inputs, ins)}
        pending = [(name, k, refs) for name, node_refs in model.calls.items() for k, refs in enumerate(node_refs)]

        def key(ref, first=called_from):
            name, node_index, tensor_index = (list(ref) + [0, 0])[:3]
            member = by_name.get(name)
            shift = first.get(name, 0) if isinstance(member, ModelNode) else 0
            return (name, int(node_index or 0) - shift, int(tensor_index or 0))

        stuck = []
        for index in _in_rounds(pending, key, made):
            name, k, refs = pending[index]
            if not all(key(r) in made for r in refs):  # reads what no call makes: its own round never comes
                stuck.append(index)
                continue
            member = by_name[name]
            given = [made[key(r)] for r in refs]
            forced = training or (name, k) in model.training
            if isinstance(member, ModelNode):
                for i, t in enumerate(expand(member, given, forced)):
                    made[(name, k, i)] = t
            else:
                made[(name, k, 0)] = call_leaf(
                    member,
                    given,
                    len(refs) > 1,
                    model.constants.get((name, k)),
                    forced,
                    model.arguments.get((name, k), ((), {})),
                    model.operands.get((name, k)),
                )
                for i in range(1, _MAX_LEAF_OUTPUTS):  # a layer's further outputs: a recurrent layer's states
                    made[(name, k, i)] = f"{made[(name, k, 0)]}@{i}"
        if stuck:
            left = [pending[i] for i in sorted(stuck)]
            missing = sorted({r[0] for p in left for r in p[2] if key(r) not in made})
            names = ", ".join(repr(p[0]) for p in left)
            raise _fail(
                source,
                f"{label}: layers {names} read outputs that no call makes "
                f"(of {', '.join(repr(m) for m in missing)}): the graph is inconsistent or cyclic",
            )
        outs = []
        for ref in model.outputs:
            if key(ref, output_from) not in made:
                raise _fail(source, f"{label} names output {list(ref)}, which no call makes")
            outs.append(made[key(ref, output_from)])
        return outs

    if root.kind == SEQUENTIAL:
        inputs = [("input#0", "input", root.input_shape)]
    else:
        by_name = {m.name: m for m in root.members}
        inputs = [
            (f"{name}#0", key, input_layer_shape(by_name[name].config))  # named as Keras's predict takes them
            for name, key in zip(root.inputs, root.input_keys or root.inputs)
        ]
    outputs = expand(root, [t for t, _, _ in inputs])
    return KerasGraph(inputs=inputs, calls=calls, outputs=outputs, output_names=root.output_names)


def _in_rounds(pending: list, key: Callable[[Any], tuple], made: dict) -> list:
    """The indices of ``pending`` calls (``(name, call index, refs)``) in the order of rounds: round 1
    holds the calls that read only what ``made`` holds already (the model's inputs), round r + 1 those
    whose last input a call of round r makes, each round in ``pending``'s order; then the calls no round
    reaches (in a cycle, or reading what no call makes), in ``pending``'s order. Linear in the calls and
    their references (each call is visited once, after its last producer), sorting aside."""
    producer = {(name, k): i for i, (name, k, _) in enumerate(pending)}
    waiting = [0] * len(pending)  # producers not yet given a round
    readers: list = [[] for _ in pending]  # i -> the calls that read what call i makes
    unreachable = set()
    for i, (_, _, refs) in enumerate(pending):
        found = set()
        for ref in refs:
            wanted = key(ref)
            if wanted in made:
                continue
            source = producer.get(wanted[:2])
            if source is None:
                unreachable.add(i)
            else:
                found.add(source)
        for source in found:
            readers[source].append(i)
        waiting[i] = len(found)
    rounds = [0] * len(pending)
    queue = [i for i in range(len(pending)) if waiting[i] == 0 and i not in unreachable]
    for i in queue:  # grows while it is walked: each call once
        rounds[i] = rounds[i] or 1
        for reader in readers[i]:
            rounds[reader] = max(rounds[reader], rounds[i] + 1)
            waiting[reader] -= 1
            if waiting[reader] == 0 and reader not in unreachable:
                queue.append(reader)
    placed = set(queue)
    return sorted(queue, key=lambda i: (rounds[i], i)) + [i for i in range(len(pending)) if i not in placed]


def _node_offsets(model: ModelNode, by_name: dict) -> tuple[dict, dict]:
    """``(in calls, in outputs)``: nested model name -> the number its first call has in the
    references of the layers' calls and in ``output_layers``.

    tf_keras numbers a nested model's calls from 1 in both (its node 0 is the model's own). Keras 3
    numbers them from 0 in calls, and in ``output_layers`` from 1 for a nested Functional (its
    loader subtracts one: node 0 is the Functional's own) and from 0 for a Sequential."""
    nested = [m for m in by_name.values() if isinstance(m, ModelNode)]
    if not model.keras3:
        return {m.name: 1 for m in nested}, {m.name: 1 for m in nested}
    return {}, {m.name: 1 for m in nested if m.kind != SEQUENTIAL}


def iter_layers(node: ModelNode, trail: tuple = ()) -> Iterator[tuple[LayerEntry, tuple]]:
    """Every leaf layer (InputLayers left out) once, in member order, each with its trail."""
    for index, member in enumerate(node.members):
        step = trail + ((node, index),)
        if isinstance(member, ModelNode):
            yield from iter_layers(member, step)
        elif member.class_name != INPUT_LAYER:
            yield member, step


def is_chain(node: ModelNode) -> bool:
    """Whether the model and every model nested in it is a single chain (without an operator on a
    constant: the graph's calls say which, for the converter to list it)."""
    if node.kind != SEQUENTIAL and (not node.chain or node.constants or node.training):
        return False
    return all(is_chain(m) for m in node.members if isinstance(m, ModelNode))


def leaves_and_graph(root: ModelNode, source: str) -> tuple[list, KerasGraph | None]:
    """``([(leaf, trail, name), ...], graph)``: for a chain, its leaves in execution order and no
    graph; for any other model, every leaf once (in the order of its first call) and the expanded
    graph, whose calls name each leaf by ``name`` (:func:`leaf_names`).
    """
    if is_chain(root):
        return named_leaves(list(iter_chain(root))), None
    leaves = named_leaves(list(iter_layers(root)))
    graph = expand_graph(root, source, {id(leaf): name for leaf, _, name in leaves})
    first: dict[str, int] = {}
    for i, call in enumerate(graph.calls):
        first.setdefault(call.layer, i)
    leaves.sort(key=lambda item: first.get(item[2], len(graph.calls)))
    return leaves, graph


def named_leaves(pairs: list) -> list:
    """``[(leaf, trail), ...]`` as ``[(leaf, trail, name), ...]`` with the names of :func:`leaf_names`."""
    return [(leaf, trail, name) for (leaf, trail), name in zip(pairs, leaf_names(pairs))]


def leaf_names(pairs: list) -> list[str]:
    """A name for each ``(leaf, trail)`` that tells the leaves apart: the layer's own name where no
    other leaf has it, else its path through the nested models, ``encoder/dense`` (Keras names
    a model's own layers apart, not those of the models nested in it: a saved model loaded and
    wrapped with a new head has two ``dense``). A layer of the top model keeps its own name."""
    counts: dict[str, int] = {}
    for leaf, _ in pairs:
        counts[leaf.name] = counts.get(leaf.name, 0) + 1
    return [
        leaf.name if counts[leaf.name] == 1 else "/".join([model.name for model, _ in trail[1:]] + [leaf.name])
        for leaf, trail in pairs
    ]


def iter_chain(node: ModelNode, trail: tuple = ()) -> Iterator[tuple[LayerEntry, tuple]]:
    """Leaf layers in execution order, each with its trail ``((model, member index), ...)``."""
    for index in node.chain:
        member = node.members[index]
        step = trail + ((node, index),)
        if isinstance(member, ModelNode):
            yield from iter_chain(member, step)
        else:
            yield member, step


def is_operation(member: Any) -> bool:
    """A Keras 3 operation on tensors in a Functional graph (``x + y`` is ``keras.src.ops.numpy.Add``):
    not a layer, so the file lists no weights for it. Its config holds its name and its own
    arguments (``Softmax``'s axis, ``Gelu``'s approximate; ``zeros_like``'s output dtype
    ``"bool"``), never ``trainable`` or a dtype policy as a layer's does, and a ``.keras`` config
    its module."""
    if not isinstance(member, LayerEntry):
        return False
    module = member.entry.get("module")
    if isinstance(module, str):
        return module.startswith("keras.src.ops.")
    return "trainable" not in member.config and member.config.get("dtype", "bool") == "bool"


def iter_leaves(node: ModelNode) -> Iterator[LayerEntry]:
    """Every non-Input leaf layer under ``node`` (any order)."""
    for member in node.members:
        if isinstance(member, ModelNode):
            yield from iter_leaves(member)
        elif member.class_name != INPUT_LAYER:
            yield member
