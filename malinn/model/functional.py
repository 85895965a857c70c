"""The Functional model: a graph of layer calls (any DAG) with one or more inputs and outputs.

Built as in Keras, from symbolic tensors::

    x = malinn.Input((8,), name="x")
    h = Dense(16, activation="relu")(x)
    y = Add()([x, Dense(8)(h)])            # a residual block
    model = malinn.Functional(x, y)        # or malinn.Model(inputs=x, outputs=y)

or by the converter from a Keras file. It shares :class:`~malinn.model.model.PlannedModel`'s plans,
passes, memory and weights with ``Sequential``: every layer call lowers into the same plan (a DAG
of steps over named values), so a merge needs no mechanism of its own. ``predict`` takes one array,
a list of arrays (one per input) or a dict by input name, and returns one array per output (a
list when there are several), as Keras does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..backends.base import Device
from ..layers.base import Layer
from ..layers.input_layer import Input, KerasTensor, Node
from ..layers.masking import carry_mask
from ..plan.builder import PlanBuilder
from ..plan.tensor import format_shape
from ..registry import register
from .model import PlannedModel

__all__ = ["Functional", "Model"]


def _flatten(tensors: Any, what: str) -> tuple[list, list | None]:
    """``(tensors, names)``: a tensor, a list of them, or a dict by name, as a list (and the dict's keys)."""
    if isinstance(tensors, dict):
        names, tensors = list(tensors), list(tensors.values())
    else:
        names = None
        tensors = list(tensors) if isinstance(tensors, (list, tuple)) else [tensors]
    if not tensors or not all(isinstance(t, KerasTensor) for t in tensors):
        raise ValueError(
            f"Functional: {what} must be malinn.Input tensors or tensors that layers return, got {tensors!r}"
        )
    return tensors, names


class Functional(PlannedModel):
    """A graph of layers from ``inputs`` to ``outputs`` (Keras's ``Model(inputs, outputs)``).

    Args:
        inputs: an input tensor (:func:`malinn.Input`), a list of them, or a dict by name.
        outputs: a tensor, a list of them or a dict by name.
        name: the model's name.
        precision: the weights' precision, as for ``Sequential`` (default ``fp32``; see
            :class:`~malinn.model.model.PlannedModel`); merges compute on float32 activations in every
            precision.

    Raises:
        ValueError: the outputs do not depend on the inputs alone (a tensor of another input), an
            input is given twice, two layers share a name, or ``precision`` is unknown.
    """

    #: ``malinn.Input``, here for code that finds the class through the registry (the converter)
    Input = staticmethod(Input)

    def __init__(
        self,
        inputs: KerasTensor | Sequence[KerasTensor] | dict[str, KerasTensor],
        outputs: KerasTensor | Sequence[KerasTensor] | dict[str, KerasTensor],
        name: str = "functional",
        precision: str = "fp32",
    ):
        super().__init__(name, precision)
        self.inputs, _ = _flatten(inputs, "inputs")
        self.outputs, self.output_names = _flatten(outputs, "outputs")
        self._single_output = not isinstance(outputs, (list, tuple, dict))
        if len({id(t) for t in self.inputs}) != len(self.inputs):
            raise ValueError(f"Functional {name!r}: an input tensor is given twice")
        if any(t.node is not None for t in self.inputs):
            raise ValueError(f"Functional {name!r}: inputs must be malinn.Input tensors")
        self.nodes = self._order()
        seen: dict[str, Layer] = {}
        for node in self.nodes:
            other = seen.setdefault(node.layer.name, node.layer)
            if other is not node.layer:
                raise ValueError(f"Functional {name!r}: two layers are named {node.layer.name!r}")
        self.layers = list(seen.values())
        names = [t.name for t in self.inputs]
        if len(set(names)) != len(names):
            raise ValueError(
                f"Functional {name!r}: two inputs are named {sorted(n for n in names if names.count(n) > 1)[0]!r}"
            )

    def _order(self) -> list:
        """The layer calls the outputs depend on, each after the calls it reads (a topological order:
        depth first from each output in turn, a call's inputs in order). Walked with a stack of its
        own, not by recursion: a graph of thousands of layers in a row has no depth limit."""
        inputs = {id(t) for t in self.inputs}
        order, done, active = [], set(), set()

        def enter(tensor: KerasTensor) -> Node | None:
            """The call making ``tensor`` where it is still to be walked, else None."""
            node = tensor.node
            if node is None:
                if id(tensor) not in inputs:
                    raise ValueError(
                        f"Functional {self.name!r}: the graph reads input {tensor.name!r}, which is not "
                        f"among the model's inputs ({', '.join(t.name for t in self.inputs)})"
                    )
                return None
            if id(node) in done:
                return None
            if id(node) in active:
                raise ValueError(f"Functional {self.name!r}: the graph has a cycle through layer {node.layer.name!r}")
            active.add(id(node))
            return node

        for t in self.outputs:
            stack: list[list[Any]] = [[node, 0]] if (node := enter(t)) is not None else []
            while stack:  # [call, how many of its inputs are walked]
                top = stack[-1]
                if top[1] < len(top[0].inputs):
                    top[1] += 1
                    if (node := enter(top[0].inputs[top[1] - 1])) is not None:
                        stack.append([node, 0])
                    continue
                stack.pop()
                active.discard(id(top[0]))
                done.add(id(top[0]))
                order.append(top[0])
        return order

    # ---------------------------------------------------------------- shapes
    @property
    def input_shapes(self) -> list:
        return [t.shape[1:] for t in self.inputs]

    @property
    def layer_calls(self) -> list:
        """The layer of each output :meth:`predict_layers` returns, in order (a shared layer once per call)."""
        return [node.layer for node in self.nodes]

    @property
    def input_names(self) -> list:
        return [t.name for t in self.inputs]

    @property
    def input_shape(self):
        """The input shape ``(None, ...)``, or a list of them when there are several inputs."""
        shapes = [t.shape for t in self.inputs]
        return shapes[0] if len(shapes) == 1 else shapes

    @property
    def output_shape(self):
        """The output shape ``(None, ...)``, or a list of them when there are several outputs."""
        shapes = [t.shape for t in self.outputs]
        return shapes[0] if self._single_output or len(shapes) == 1 else shapes

    def _output_shapes(self, every_layer: bool) -> list:
        return [node.output.shape for node in self.nodes] if every_layer else [t.shape for t in self.outputs]

    # ---------------------------------------------------------------- plans
    def _lower(self, builder: PlanBuilder, every_layer: bool) -> list:
        uses = {id(t): 0 for t in self.inputs}
        for node in self.nodes:
            for t in node.inputs:
                if id(t) in uses:
                    uses[id(t)] += 1
        values = {
            id(t): builder.input(t.shape[1:], name=t.name, uses=uses[id(t)] + (t in self.outputs)) for t in self.inputs
        }
        per_node = []
        for node in self.nodes:
            given = [values[id(t)] for t in node.inputs]
            value = builder.lower(node.layer, given if node.listed else given[0])
            carry_mask(builder, node.layer, given if node.listed else given[0], value)  # Keras's mask passed on
            for tensor, one in zip(node.outputs, value if isinstance(value, list) else [value]):
                values[id(tensor)] = one
            per_node.append(values[id(node.output)])
        return per_node if every_layer else [values[id(t)] for t in self.outputs]

    # ---------------------------------------------------------------- inference
    def _input_casts(self) -> list:
        return [t.cast for t in self.inputs]

    def _check_inputs(self, x: Any, convert: bool = True) -> list:
        n = len(self.inputs)
        if isinstance(x, dict):
            missing = [name for name in self.input_names if name not in x]
            extra = [name for name in x if name not in self.input_names]
            if missing or extra:
                raise ValueError(
                    f"Functional {self.name!r} takes inputs named {self.input_names}; "
                    f"{'missing ' + str(missing) if missing else ''}"
                    f"{' and ' if missing and extra else ''}{'unknown ' + str(extra) if extra else ''}"
                )
            arrays = [x[name] for name in self.input_names]
        elif isinstance(x, (list, tuple)) and (
            n > 1
            or (
                len(x) >= 1
                and (
                    (ndim := self._ndim(x[0], f"input {self.input_names[0]!r}")) == len(self.inputs[0].shape)
                    or (len(x) == 1 and self._conformable(ndim, self.inputs[0].shape[1:]))
                )
            )
        ):
            # several inputs, or for one input a list whose items are whole batches (not samples)
            if len(x) != n:
                raise ValueError(
                    f"Functional {self.name!r} takes {n} input(s) ({', '.join(self.input_names)}), "
                    f"got a list of {len(x)}"
                )
            arrays = list(x)
        elif n == 1:
            arrays = [x]
        else:
            raise ValueError(
                f"Functional {self.name!r} takes {n} inputs ({', '.join(self.input_names)}): pass a "
                f"list of arrays or a dict by name"
            )
        checked = []
        for tensor, array in zip(self.inputs, arrays):
            who = f"input {tensor.name!r}"
            was_array = isinstance(array, np.ndarray)
            array = self._as_float32(array, who)
            given, array = array.shape, self._conformed(array, tensor.shape)
            if array.shape[1:] != tensor.shape[1:] or array.ndim != len(tensor.shape):
                raise ValueError(
                    f"Input {tensor.name!r} of model {self.name!r} is incompatible: expected shape "
                    f"{format_shape(tensor.shape)}, found shape {given}"
                    f"{self._one_sample_hint(given, tensor.shape[1:], was_array)}"
                )
            checked.append(self._contiguous(array, tensor.cast) if convert else array)
        return checked

    def predict(
        self,
        x: Any,
        batch_size: int | None = None,
        verbose: str | int = "auto",
        steps: int | None = None,
        devices: str | Device | list | tuple | None = None,
    ) -> np.ndarray | list[np.ndarray] | dict[str, np.ndarray]:
        """Runs the model, as Keras's ``predict``.

        Args:
            x: one array (a model of one input), a list of arrays in input order, or a dict of
                arrays by input name, each ``(batch, ...)`` (memory-mapped ``.npy`` arrays are read
                one batch at a time); float64 and integers are cast to float32 as Keras does, and
                each rank adjusted as Keras's (the last axis added for an input whose last size is
                1, an extra last axis of 1 dropped). Or an iterable of such batches (a generator, a
                data loader; an item ``(x,)``, ``(x, y)`` or ``(x, y, sample_weight)`` gives its
                ``x``, as Keras: yield ``(x,)`` with ``x`` a list for several inputs, or a dict).
            batch_size: samples per device pass (default: all in one pass, as ``Sequential.predict``
                says: Keras's is 32).
            verbose: Keras's: 0, 1 (a progress bar on stdout), 2, or "auto" (1 on a terminal where
                more than one batch runs, as ``Sequential.predict`` says).
            steps: the batches to draw from an iterable (all where None), as Keras's; with arrays,
                ``steps`` batches of ``batch_size``, or every sample in ``steps`` batches where it is
                not given (a UserWarning where fewer batches are there), as ``Sequential.predict``.
            devices: the devices to spread the passes over (default: ``set_device``'s list, else the
                current device), as ``Sequential.predict``.

        Returns:
            A float32 array of the output's shape, or a list of them (a dict where the outputs were
            given as one) when the model has several outputs.

        Raises:
            ValueError: an input is missing, not numeric, or of another shape; the inputs have
                different numbers of samples; ``batch_size``, ``steps`` or ``verbose`` is not one
                Keras takes.
            DeviceError: the device failed; the message names the layer, the shape and (with several
                devices) the device.
        """
        results = self._run(x, batch_size, False, verbose, steps, devices)
        if self.output_names is not None:
            return dict(zip(self.output_names, results))
        return results[0] if self._single_output or len(results) == 1 else results

    def predict_layers(self, x: Any) -> list:
        """Runs the model on ``x`` and returns every layer call's output, for layer-by-layer checks.

        Args:
            x: as for :meth:`predict`.

        Returns:
            A list with one float32 array per layer call, in :attr:`nodes` order, each in Keras's
            output shape.

        Raises:
            ValueError, DeviceError: as for :meth:`predict`.
        """
        return self._run(x, None, every_layer=True)

    def __call__(self, x: Any, training: bool | None = None) -> np.ndarray | list[np.ndarray] | dict[str, np.ndarray]:
        """:meth:`predict` on ``x`` (see :meth:`~malinn.model.model.PlannedModel.called_on`)."""
        return self.predict(self.called_on(x, training))

    # ---------------------------------------------------------------- config and summary
    def _refs(self) -> dict:
        """id(tensor) -> ``[kind, index]``: ``["input", i]`` or ``["node", j]``."""
        refs = {id(t): ["input", i] for i, t in enumerate(self.inputs)}
        refs.update({id(node.output): ["node", j] for j, node in enumerate(self.nodes)})
        refs.update(
            {id(t): ["node", j, k] for j, node in enumerate(self.nodes) for k, t in enumerate(node.outputs) if k}
        )  # a layer's further outputs (a recurrent layer's states)
        return refs

    def get_config(self) -> dict:
        """The inputs, the layers (each once), the calls (layer index, input tensors), the outputs and
        the weights' precision."""
        refs, index = self._refs(), {id(layer): i for i, layer in enumerate(self.layers)}
        return {
            "name": self.name,
            "precision": self.precision,
            "inputs": [
                {"name": t.name, "shape": list(t.shape[1:]), **({"dtype": t.dtype} if t.dtype != "float32" else {})}
                for t in self.inputs
            ],
            "layers": [{"class_name": type(layer).__name__, "config": layer.get_config()} for layer in self.layers],
            "nodes": [
                {"layer": index[id(node.layer)], "inputs": [refs[id(t)] for t in node.inputs], "listed": node.listed}
                for node in self.nodes
            ],
            "outputs": [refs[id(t)] for t in self.outputs],
            "output_names": self.output_names,
            "single_output": self._single_output,
        }

    @classmethod
    def from_layers(cls, config: dict, layers: list, precision: str = "fp32") -> "Functional":
        """The model :meth:`get_config` describes, with ``layers`` (made from its layer configs).

        Raises:
            ValueError: the config is inconsistent (a call reads a tensor made after it).
        """
        from_graph: list[Any] = [None] * len(config["nodes"])  # each call's output, a tensor or a list of them
        inputs = [_input(entry) for entry in config["inputs"]]

        def tensor(ref: list) -> KerasTensor:
            kind, i = ref[:2]
            found = inputs[i] if kind == "input" else from_graph[i]
            if isinstance(found, list):  # a layer of several outputs: ["node", j, k] names its k-th
                found = found[ref[2] if len(ref) > 2 else 0]
            if found is None:
                raise ValueError(f"model {config['name']!r}: a call reads {kind} {i} before it is made")
            return found

        for j, entry in enumerate(config["nodes"]):
            given = [tensor(ref) for ref in entry["inputs"]]
            from_graph[j] = layers[entry["layer"]](given if entry["listed"] else given[0])
        made = [tensor(ref) for ref in config["outputs"]]
        outputs: list[KerasTensor] | dict[str, KerasTensor] | KerasTensor = made
        if config.get("output_names"):
            outputs = dict(zip(config["output_names"], made))
        elif config.get("single_output", len(made) == 1):
            outputs = made[0]
        return cls(inputs, outputs, name=config["name"], precision=precision)

    def _summary_rows(self, kernels: dict) -> list:
        calls: dict[int, list[Node]] = {}
        for node in self.nodes:
            calls.setdefault(id(node.layer), []).append(node)
        label = {id(t): f"{t.name}[0][0]" for t in self.inputs}
        for nodes in calls.values():
            for i, node in enumerate(nodes):
                label[id(node.output)] = f"{node.layer.name}[{i}][0]"
        rows = [("Layer (type)", "Output Shape", "Param #", "Connected to", "Kernel")]
        for t in self.inputs:
            rows.append((f"{t.name} (InputLayer)", format_shape(t.shape), "0", "-", ""))
        for layer in self.layers:
            nodes = calls[id(layer)]
            shapes = {format_shape(node.output.shape) for node in nodes}
            connected = ", ".join(label[id(t)] for node in nodes for t in node.inputs)
            rows.append(
                (
                    layer.summary_label(),
                    shapes.pop() if len(shapes) == 1 else "multiple",
                    str(layer.count_params()),
                    connected,
                    kernels.get(layer.name, ""),
                )
            )
        return rows


def _input(entry: dict) -> KerasTensor:
    shape = tuple(int(d) for d in entry["shape"])
    if not shape or math.prod(shape) < 1:
        raise ValueError(f"input {entry.get('name')!r} has shape {shape!r}")
    return Input(shape, name=entry["name"], dtype=entry.get("dtype"))  # files without one: float32


#: Keras's name for a model built from inputs and outputs
Model = Functional

register("model", Functional)
