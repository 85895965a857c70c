"""Whether every object a model's forward pass depends on is Keras's own, not custom code.

A Keras file names its classes and functions; their code is not in it. A custom object may carry
the name of a built-in: a Dense subclass registered as ``adv>Dense`` is written with class_name
``Dense``, an activation registered as ``adv>relu`` with the function name ``adv>relu``, a
Sequential subclass with its own ``call`` keeps the Sequential's config. Keras loads such a file
only with the custom code at hand; malinn never has it, and reading the names as built-ins would
compute something else. So every model, every layer and every object inside a layer's config
(an activation, a dtype policy, a wrapped layer...) must be Keras's own:

* its ``module``, where the file writes one (``.keras`` configs; legacy ``.h5`` configs have
  none), is ``keras`` or ``tf_keras`` or a module below them (``keras.layers``,
  ``keras.src.models.functional``, ``tf_keras.src.engine.functional``); Keras writes the
  built-in functions' names with module ``builtins``;
* its ``registered_name``, where not null, is its own class name (``Functional``); a function's
  is ``"function"`` or the function's name;
* its class or function name has no ``>``: ``package>name`` is how Keras names a registered
  custom object, and how tf_keras and Keras 3 write one as the class_name of a legacy ``.h5``;
* a model is a Sequential, a Functional or (Keras 2) a Model: any other class is a subclass with
  code of its own.

Objects that matter for training only (initializers, regularizers, constraints) are not checked.
A custom function saved without registration under a built-in's plain name (``relu``) cannot be
told apart: Keras itself loads it as the built-in.
"""

from __future__ import annotations

from typing import Any

from malinn.errors import ConversionError

from .chain import LayerEntry, ModelNode

#: The packages whose modules are Keras's own.
KERAS_PACKAGES = ("keras", "tf_keras")
#: The model classes Keras saves without code of their own.
MODEL_CLASSES = frozenset({"Sequential", "Functional", "Model"})
#: Keys of a layer's config whose objects only matter for training.
TRAINING_ONLY_SUFFIXES = ("_initializer", "_regularizer", "_constraint")
#: Registered names of keras.applications' own layers, which tf_keras writes as a custom object's
#: class name in ``.h5`` (InceptionResNetV2 registers its CustomScaleLayer under the package ``Custom``).
APPLICATION_CLASSES = frozenset({"Custom>CustomScaleLayer"})
#: Serialized values that are data, not code.
DATA_CLASSES = frozenset({"__keras_tensor__", "__tensor__", "__numpy__", "__bytes__", "__ellipsis__", "__slice__"})


def is_keras_module(module: Any) -> bool:
    """True for ``keras``, ``tf_keras`` and their submodules (``keras.layers``...)."""
    return isinstance(module, str) and any(
        module == package or module.startswith(package + ".") for package in KERAS_PACKAGES
    )


def check_keras_own(root: ModelNode, source: str) -> None:
    """Raise :class:`ConversionError` naming every custom object of the model.

    Args:
        root: the model as :func:`converters.chain.parse_model` read it.
        source: the file, for the message.

    Raises:
        ConversionError: one line listing each custom model, layer and activation (name, class
            or function, registered name, module).
    """
    found: list[str] = []
    _check_model(root, found)
    if found:
        raise ConversionError(
            f"{source}: custom code, which a Keras file does not hold (Keras too needs it to "
            f"load the file), so malinn cannot know what it computes: {'; '.join(found)}. "
            "Build the model from Keras's built-in layers and activations to convert it"
        )


def _check_model(node: ModelNode, found: list[str]) -> None:
    if node.entry and not _class_is_own(node.entry, model=True):
        found.append(f"model {node.name!r} ({_describe(node.entry)})")
    for member in node.members:
        if isinstance(member, ModelNode):
            _check_model(member, found)
        elif isinstance(member, LayerEntry):
            label = f"layer {member.name!r}"
            if not _class_is_own(member.entry, model=False):
                found.append(f"{label} ({_describe(member.entry)})")
            else:
                _check_config(member.config, label, found)


def _class_is_own(entry: dict, model: bool) -> bool:
    class_name = entry.get("class_name")
    if not isinstance(class_name, str) or (">" in class_name and class_name not in APPLICATION_CLASSES):
        return False
    if "module" in entry and not is_keras_module(entry["module"]):
        return False
    registered = entry.get("registered_name")
    if registered is not None and registered != class_name and registered not in APPLICATION_CLASSES:
        return False
    return class_name in MODEL_CLASSES if model else True


def _function_is_own(obj: dict) -> bool:
    name = obj.get("config")
    if not isinstance(name, str) or not _name_is_own(name):
        return False
    module = obj.get("module", "builtins")
    if module != "builtins" and not is_keras_module(module):
        return False
    return obj.get("registered_name") in (None, "function", name)


def _object_is_own(obj: dict) -> bool:
    class_name = obj.get("class_name")
    if class_name == "function":
        return _function_is_own(obj)
    if class_name == "__lambda__":  # Python bytecode in the file
        return False
    return _class_is_own(obj, model=False)


def _name_is_own(name: str) -> bool:
    """An activation written as a string: ``relu``, or a dotted name inside Keras."""
    if ">" in name:
        return False
    return "." not in name or is_keras_module(name.rsplit(".", 1)[0])


def _check_config(value: Any, label: str, found: list[str], key: str = "") -> None:
    """Every serialized object (and activation name) inside a layer's config."""
    if isinstance(value, dict):
        class_name = value.get("class_name")
        if isinstance(class_name, str):
            if class_name in DATA_CLASSES:
                return
            if not _object_is_own(value):
                found.append(f"{label} {key or 'config'} ({_describe(value)})")
                return
        for name, item in value.items():
            if isinstance(name, str) and name.endswith(TRAINING_ONLY_SUFFIXES):
                continue
            _check_config(item, label, found, name if isinstance(name, str) else key)
    elif isinstance(value, list):
        for item in value:
            _check_config(item, label, found, key)
    elif isinstance(value, str) and key.endswith("activation") and not _name_is_own(value):
        found.append(f"{label} {key} ({value!r})")


def _describe(obj: dict) -> str:
    class_name = obj.get("class_name")
    if class_name == "function":
        parts = [f"function {obj.get('config')!r}"]
    elif class_name == "__lambda__":
        parts = ["a Python lambda"]
    else:
        parts = [f"class {class_name!r}"]
    registered = obj.get("registered_name")
    if registered not in (None, "function", class_name, obj.get("config")):
        parts.append(f"registered as {registered!r}")
    if "module" in obj:
        parts.append(f"module {obj['module']!r}")
    return ", ".join(parts)
