"""Fuzzing the converter (docs/RELIABILITY.md).

Over a thousand mutated model files, made with a fixed seed from three valid ones: the Keras 3
archive examples/digits_mlp.keras, a Keras 3 legacy ``.h5`` of the same model (written here with
h5py, the way Keras lays it out) and a malinn model file (made with ``malinn.convert``). Mutations:
truncations, flipped and overwritten bytes, zip members missing or replaced, config.json /
model_config / malinn config JSON mutated node by node (keys removed, values of the wrong type,
sizes inconsistent with the weights), HDF5 attributes removed or of the wrong type, datasets
removed, of the wrong shape or type, replaced by groups, links or cycles.

Each file goes to ``malinn.convert(src, dst)`` in a worker process (this file, run as a script:
TensorFlow is never imported anywhere); the test asserts for every file that

* only ``malinn.ConversionError`` escapes (never another exception type), naming the file;
* it answers within ``PER_FILE_SECONDS`` (a hang or a crash of the worker is a failure; the worker
  is then restarted);
* no partial output is left: after an error no ``dst`` and no temporary file exist, after a success
  ``dst`` is a complete malinn model file that loads.
"""

from __future__ import annotations

import io
import json
import os
import random
import select
import subprocess
import sys
import threading
import time
import traceback
import zipfile
from pathlib import Path

import h5py
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "examples" / "digits_mlp.keras"
SEED = 20240605
PER_FILE_SECONDS = 20.0
WORKERS = 2
TARGETS = ["cpu", "gpu", "morton_4_2"]
COUNTS = {"keras": 900, "h5": 800, "malinn": 700}  # 2,400 files in all

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


# ===================================================================================== worker


def worker_main() -> int:
    """Reads ``{"src", "dst", "target"}`` lines on stdin, converts, answers one JSON line each."""
    import malinn

    # a line for the parent to know the worker is ready (imports take a moment)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        src, dst = job["src"], job["dst"]
        answer = {"src": src}
        start = time.perf_counter()
        try:
            malinn.convert(src, dst, target=job["target"])
            answer["outcome"] = "ok"
            try:  # a success must leave a complete file
                model = malinn.load_model(dst)
                answer["reloaded_weights"] = len(model.get_weights())
            except BaseException as exc:
                answer["reload_error"] = f"{type(exc).__module__}.{type(exc).__name__}: {exc}"
        except malinn.ConversionError as exc:
            answer["outcome"] = "ConversionError"
            answer["message"] = str(exc)[:500]
        except BaseException as exc:  # what the test exists to find
            answer["outcome"] = f"{type(exc).__module__}.{type(exc).__name__}"
            answer["message"] = str(exc)[:500]
            answer["traceback"] = traceback.format_exc()[-3000:]
        answer["seconds"] = time.perf_counter() - start
        folder = Path(dst).parent
        answer["left"] = sorted(p.name for p in folder.iterdir())
        for p in folder.iterdir():  # the next file starts from an empty folder
            p.unlink()
        print(json.dumps(answer), flush=True)
    return 0


# ============================================================================== the base files


def keras_members() -> dict:
    with zipfile.ZipFile(DIGITS) as z:
        return {name: z.read(name) for name in z.namelist()}


def write_zip(members: dict, extra=()) -> bytes:
    """A zip of ``members`` (name -> bytes), then ``extra`` (name, bytes) pairs (names may repeat)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for name, data in list(members.items()) + list(extra):
            z.writestr(name, data)
    return buffer.getvalue()


def h5_bytes(build) -> bytes:
    """An HDF5 file made in memory by ``build(h5py.File)``."""
    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as f:
        build(f)
    return buffer.getvalue()


def legacy_h5_from_keras(members: dict) -> bytes:
    """The digits model as Keras 3's legacy ``model.save("m.h5")`` lays it out."""
    config = json.loads(members["config.json"])
    weights = h5py.File(io.BytesIO(members["model.weights.h5"]), "r")
    names = [layer["config"]["name"] for layer in config["config"]["layers"] if layer["class_name"] != "InputLayer"]
    saving = {
        "dense": "dense",
        "batch_normalization": "batch_normalization",
        "activation": "activation",
        "dropout": "dropout",
        "dense_1": "dense_1",
        "dense_2": "dense_2",
    }
    variable_names = {
        "Dense": ["kernel", "bias"],
        "BatchNormalization": ["gamma", "beta", "moving_mean", "moving_variance"],
    }
    classes = {layer["config"]["name"]: layer["class_name"] for layer in config["config"]["layers"]}

    def build(f):
        f.attrs["keras_version"] = "3.15.1"
        f.attrs["backend"] = "tensorflow"
        f.attrs["model_config"] = json.dumps(config)
        group = f.create_group("model_weights")
        group.attrs["layer_names"] = np.array([n.encode() for n in names])
        group.attrs["backend"] = "tensorflow"
        group.attrs["keras_version"] = "3.15.1"
        for name in names:
            g = group.create_group(name)
            vars_ = weights[f"layers/{saving[name]}/vars"]
            wnames = [f"{name}/{v}" for v in variable_names.get(classes[name], [])][: len(vars_)]
            g.attrs["weight_names"] = np.array([w.encode() for w in wnames])
            for i, wname in enumerate(wnames):
                g.create_dataset(wname, data=vars_[str(i)][()])

    data = h5_bytes(build)
    weights.close()
    return data


# ============================================================================ JSON mutations

ODD_VALUES = [
    None,
    True,
    False,
    0,
    -1,
    1,
    2**31,
    10**30,
    -(10**12),
    0.5,
    -2.5,
    1e308,
    float("nan"),
    float("inf"),
    "",
    "x",
    "relu",
    "Dense",
    "-1",
    "1e9",
    [],
    {},
    [None],
    [1, 2, 3],
    {"a": 1},
    [[[]]],
    "\u0000\ufffd",
]
CLASS_NAMES = [
    "Dense",
    "Conv2D",
    "Sequential",
    "Functional",
    "InputLayer",
    "Model",
    "Lambda",
    "Activation",
    "BatchNormalization",
    "Flatten",
    "Dropout",
    "Add",
    "Bogus",
    "",
]
SIZES = [0, -5, 1, 3, 31, 33, 10**9, 2**40, 2.5, "32", None]


def json_paths(node, path=()):
    """Every (path, value) inside a JSON document."""
    yield path, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from json_paths(value, path + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from json_paths(value, path + (i,))


def set_at(doc, path, value, delete=False):
    if not path:
        return value
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return doc


def mutate_json(doc, rng: random.Random):
    """One random mutation of a JSON document (a deep copy is changed and returned), or the text
    of a broken document. Biased towards the keys that matter: class_name, units, shapes, names,
    activation, layers."""
    doc = json.loads(json.dumps(doc))
    paths = list(json_paths(doc))
    important = [
        (p, v)
        for p, v in paths
        if p
        and p[-1]
        in (
            "class_name",
            "units",
            "batch_shape",
            "batch_input_shape",
            "input_shape",
            "name",
            "activation",
            "layers",
            "config",
            "use_bias",
            "center",
            "scale",
            "epsilon",
            "axis",
            "momentum",
            "input_shape",
            "keras_names",
            "keras_version",
            "rate",
            "dtype",
            "build_config",
        )
    ]
    choice = rng.random()
    if choice < 0.06:  # not a document at all
        return rng.choice(
            [
                "",
                "{",
                "[1,",
                "null",
                "42",
                '"text"',
                '{"class_name": }',
                "\xff\xfe",
                "[" * 5000 + "]" * 5000,
                '{"a":' * 3000 + "1" + "}" * 3000,
                json.dumps(doc)[: rng.randrange(1, len(json.dumps(doc)))],
            ]
        )
    path, value = rng.choice(important if important and choice < 0.75 else paths)
    if not path:
        return rng.choice([[], None, "Sequential", [doc], {"config": doc}])
    key = path[-1]
    action = rng.random()
    if action < 0.25 and isinstance(key, (str, int)):
        return set_at(doc, path, None, delete=True)
    if key == "class_name":
        return set_at(doc, path, rng.choice(CLASS_NAMES + ODD_VALUES[:6]))
    if key == "units":
        return set_at(doc, path, rng.choice(SIZES))
    if key in ("batch_shape", "batch_input_shape", "input_shape"):
        return set_at(
            doc,
            path,
            rng.choice(
                [
                    [None, 10**9],
                    [None],
                    [],
                    [None, 0],
                    [None, -3],
                    [None, 64, 64],
                    "abc",
                    [None, "64"],
                    [None, 65],
                    [None, 1],
                    [None, 2.5],
                    None,
                ]
            ),
        )
    if key == "layers" and isinstance(value, list) and value:
        op = rng.randrange(5)
        if op == 0:
            value.pop(rng.randrange(len(value)))
        elif op == 1:
            value.insert(rng.randrange(len(value) + 1), json.loads(json.dumps(rng.choice(value))))
        elif op == 2:
            value.reverse()
        elif op == 3:
            rng.shuffle(value)
        else:  # a random subset, in order: models without their Dense layers, or without the input
            keep = sorted(rng.sample(range(len(value)), rng.randrange(len(value) + 1)))
            value[:] = [value[i] for i in keep]
        return doc
    if key == "name":
        names = [v for p, v in paths if p and p[-1] == "name" and isinstance(v, str)]
        return set_at(doc, path, rng.choice(names + ODD_VALUES[:8]))
    if key == "activation":
        return set_at(
            doc,
            path,
            rng.choice(
                ["relu6", "swishy", "softmax", None, 3, {"class_name": "x"}, {"registered_name": "gelu"}, ["relu"]]
            ),
        )
    return set_at(doc, path, rng.choice(ODD_VALUES))


def mutate_json_repeatedly(doc, rng: random.Random):
    """One to three mutations in a row."""
    for _ in range(rng.choice([1, 1, 2, 3])):
        doc = mutate_json(doc, rng)
        if isinstance(doc, str):
            break
    return doc


def dumps(doc) -> bytes:
    return (doc if isinstance(doc, str) else json.dumps(doc)).encode("utf-8")


# ============================================================================ HDF5 mutations


def h5_objects(data: bytes):
    """(groups, datasets, attributes) of an HDF5 file: paths, and (path, name) of attributes."""
    groups, datasets, attributes = ["/"], [], []
    with h5py.File(io.BytesIO(data), "r") as f:
        attributes += [("/", name) for name in f.attrs]

        def visit(name, obj):
            (datasets if isinstance(obj, h5py.Dataset) else groups).append(name)
            attributes.extend((name, a) for a in obj.attrs)

        f.visititems(visit)
    return groups, datasets, attributes


def edit_h5(data: bytes, edit) -> bytes:
    buffer = io.BytesIO(data)
    with h5py.File(buffer, "r+") as f:
        edit(f)
    return buffer.getvalue()


def bad_attribute_values(rng):
    return [
        np.int64(rng.randrange(-5, 5)),
        np.float64(2.5),
        np.array([1, 2, 3]),
        np.array([], dtype="S1"),
        b"\xff\xfe\x00bad",
        np.array([b"a", b"b"]),
        "x" * 70000,
        np.array([[1.0]]),
        np.bool_(True),
        np.array([1.5, float("nan")]),
        np.array(["dense", "dense"], dtype=h5py.string_dtype()),
        np.zeros((2, 2), dtype=[("a", "<i4"), ("b", "<f8")]),
    ]


def h5_mutation(data: bytes, rng: random.Random, json_attributes=("model_config", "config")):
    """One structural mutation of an HDF5 file: an attribute removed, of the wrong type or (for a
    JSON attribute) mutated; a dataset removed, reshaped, retyped, replaced by a group or a link;
    a group removed or replaced."""
    groups, datasets, attributes = h5_objects(data)
    if rng.random() < 0.85:  # mostly what the readers use, not the optimizer's state
        groups = [g for g in groups if not g.startswith("optimizer")] or groups
        datasets = [d for d in datasets if not d.startswith("optimizer")] or datasets
        attributes = [a for a in attributes if not a[0].startswith("optimizer")] or attributes
    kind = rng.random()
    if kind < 0.4 and attributes:
        path, name = rng.choice(attributes)

        def edit(f):
            holder = f[path]
            if name in json_attributes and rng.random() < 0.6:
                try:
                    value = holder.attrs[name]
                    doc = json.loads(value.decode() if isinstance(value, bytes) else str(value))
                    holder.attrs[name] = dumps(mutate_json_repeatedly(doc, rng)).decode("utf-8")
                    return
                except (ValueError, TypeError, UnicodeError):
                    pass
            if rng.random() < 0.35:
                del holder.attrs[name]
            else:
                try:
                    holder.attrs[name] = rng.choice(bad_attribute_values(rng))
                except Exception:  # h5py refuses some values (a header over 64 KiB): remove instead
                    if name in holder.attrs:
                        del holder.attrs[name]

        return edit_h5(data, edit)
    if kind < 0.8 and datasets:
        path = rng.choice(datasets)

        def edit(f):
            old = f[path]
            value = old[()]
            op = rng.randrange(11)
            del f[path]
            if op == 0:
                return  # removed
            if op == 1 and np.ndim(value) == 2:
                f.create_dataset(path, data=np.ascontiguousarray(value.T))  # transposed
            elif op == 2:
                shape = tuple(s + rng.choice([-1, 1, 7]) for s in np.shape(value)) or (3,)
                f.create_dataset(path, data=np.ones([max(0, s) for s in shape], np.float32))
            elif op == 3:
                f.create_dataset(path, data=np.array([b"not", b"numbers"]))
            elif op == 4:
                f.create_dataset(path, data=np.float32(1.5))  # a scalar
            elif op == 5:
                f.create_dataset(path, shape=(0,), dtype="f4")  # empty
            elif op == 6:
                f.create_group(path)  # a group instead
            elif op == 7:
                f[path] = h5py.SoftLink("/" + path)  # a link to itself
            elif op == 8:
                f[path] = h5py.ExternalLink("no_such_file.h5", "/x")  # a dangling external link
            elif op == 9:
                f.create_dataset(path, data=np.asarray(value).astype(np.complex64))
            else:
                f.create_dataset(path, data=np.full(np.shape(value), np.nan, np.float32))

        return edit_h5(data, edit)
    path = rng.choice(groups[1:] or groups)

    def edit(f):
        op = rng.randrange(4)
        if path == "/":
            f.create_group(f"extra{rng.randrange(100)}")
            return
        if op == 0:
            del f[path]
        elif op == 1:
            del f[path]
            f.create_dataset(path, data=np.arange(4.0))
        elif op == 2:
            f[path].create_dataset(f"{rng.randrange(10)}_{len(f[path])}", data=np.ones((2, 2)))  # unexpected
        else:
            f[path + "_moved"] = f[path]
            del f[path]

    return edit_h5(data, edit)


# ============================================================================ byte mutations


def byte_mutation(data: bytes, rng: random.Random) -> bytes:
    """Truncated, bits flipped, a region overwritten, bytes inserted or removed."""
    op = rng.randrange(6)
    n = len(data)
    if op == 0:
        return data[: rng.choice([0, 1, 4, 7, 8, 22, 100, 511, 512, n // 2, n - 22, n - 1, rng.randrange(n)])]
    out = bytearray(data)
    if op == 1:
        for _ in range(rng.choice([1, 1, 2, 4, 16])):
            out[rng.randrange(n)] ^= 1 << rng.randrange(8)
    elif op == 2:
        start = rng.randrange(n)
        length = rng.choice([1, 4, 8, 64, 512])
        out[start : start + length] = bytes(rng.choice([0, 0xFF, rng.randrange(256)]) for _ in range(length))
    elif op == 3:
        start = rng.randrange(n)
        out[start:start] = bytes(rng.randrange(256) for _ in range(rng.choice([1, 3, 100])))
    elif op == 4:
        start = rng.randrange(n)
        del out[start : start + rng.choice([1, 8, 1000])]
    else:  # a header field: the first 600 bytes hold the superblock or the first zip header
        for _ in range(rng.choice([1, 2, 3])):
            out[rng.randrange(min(n, 600))] = rng.randrange(256)
    return bytes(out)


# ============================================================================ the corpora


def _deflated(members: dict) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buffer.getvalue()


def keras_corpus(members: dict, rng: random.Random, count: int):
    """(label, bytes) of mutated .keras archives."""
    base = write_zip(members)
    config = json.loads(members["config.json"])
    fixed = [
        ("no config.json", write_zip({k: v for k, v in members.items() if k != "config.json"})),
        ("no model.weights.h5", write_zip({k: v for k, v in members.items() if k != "model.weights.h5"})),
        ("no metadata.json", write_zip({k: v for k, v in members.items() if k != "metadata.json"})),
        ("only metadata.json", write_zip({"metadata.json": members["metadata.json"]})),
        ("empty zip", write_zip({})),
        (
            "weights as npz",
            write_zip(
                {
                    **{k: v for k, v in members.items() if k != "model.weights.h5"},
                    "model.weights.npz": b"PK\x05\x06" + bytes(18),
                }
            ),
        ),
        ("a zip inside", write_zip({"config.json": base, "model.weights.h5": base})),
        ("config is the weights", write_zip({**members, "config.json": members["model.weights.h5"]})),
        ("weights are the config", write_zip({**members, "model.weights.h5": members["config.json"]})),
        ("empty weights", write_zip({**members, "model.weights.h5": b""})),
        ("metadata not an object", write_zip({**members, "metadata.json": b"[1, 2]"})),
        ("metadata version a number", write_zip({**members, "metadata.json": b'{"keras_version": 3}'})),
        ("metadata version 1", write_zip({**members, "metadata.json": b'{"keras_version": "1.2.2"}'})),
        ("metadata version 2", write_zip({**members, "metadata.json": b'{"keras_version": "2.15.0"}'})),
        ("metadata version junk", write_zip({**members, "metadata.json": b'{"keras_version": "abc"}'})),
        ("duplicate config.json", write_zip(members, [("config.json", b"{}")])),
        ("duplicate weights", write_zip(members, [("model.weights.h5", b"junk")])),
        ("compressed", _deflated(members)),
    ]
    out = list(fixed)
    while len(out) < count:
        kind = rng.random()
        if kind < 0.22:
            out.append(("bytes", byte_mutation(base, rng)))
        elif kind < 0.3:  # bytes of a deflated archive: CRC and inflate errors
            out.append(("deflated bytes", byte_mutation(_deflated(members), rng)))
        elif kind < 0.6:
            out.append(
                ("config.json", write_zip({**members, "config.json": dumps(mutate_json_repeatedly(config, rng))}))
            )
        elif kind < 0.9:
            out.append(
                (
                    "model.weights.h5 structure",
                    write_zip({**members, "model.weights.h5": h5_mutation(members["model.weights.h5"], rng)}),
                )
            )
        else:
            out.append(
                (
                    "model.weights.h5 bytes",
                    write_zip({**members, "model.weights.h5": byte_mutation(members["model.weights.h5"], rng)}),
                )
            )
    return out[:count]


def h5_corpus(data: bytes, rng: random.Random, count: int):
    out = []
    while len(out) < count:
        kind = rng.random()
        if kind < 0.3:
            out.append(("bytes", byte_mutation(data, rng)))
        else:
            out.append(("structure", h5_mutation(data, rng)))
    return out


def malinn_corpus(data: bytes, rng: random.Random, count: int):
    def set_attr(name, value):
        return edit_h5(data, lambda f: f.attrs.__setitem__(name, value))

    fixed = [
        ("format version 99", set_attr("format_version", 99)),
        ("format version text", set_attr("format_version", "one")),
        ("format version array", set_attr("format_version", np.array([1, 2]))),
        ("format name wrong", set_attr("malinn_format", "other")),
        ("config not JSON", set_attr("config", "{")),
        ("source not JSON", set_attr("source", "}")),
        ("no layers group", edit_h5(data, lambda f: f.__delitem__("layers"))),
        ("no layer 0", edit_h5(data, lambda f: f["layers"].__delitem__("0"))),
    ]
    out = list(fixed)
    while len(out) < count:
        kind = rng.random()
        if kind < 0.25:
            out.append(("bytes", byte_mutation(data, rng)))
        else:
            out.append(("structure", h5_mutation(data, rng, json_attributes=("config", "source"))))
    return out[:count]


# ============================================================================== the test


class Worker:
    """One worker process converting files; restarted after a hang or a crash."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.proc = None

    def start(self):
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join(
                [str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
            ),
            PYTHONWARNINGS="ignore",
        )
        self.log = open(self.folder.parent / f"{self.folder.name}.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=env,
            bufsize=0,
        )
        assert json.loads(self._line(120)) == {"ready": True}

    def _line(self, timeout):
        line = b""
        deadline = time.monotonic() + timeout
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.proc.stdout], [], [], left)[0]:
                raise TimeoutError
            chunk = self.proc.stdout.readline()
            if not chunk:
                raise EOFError
            line += chunk
        return line.decode()

    def convert(self, src: Path, target: str) -> dict:
        if self.proc is None:
            self.start()
        dst = self.folder / "out.malinn"
        job = json.dumps({"src": str(src), "dst": str(dst), "target": target}) + "\n"
        start = time.monotonic()
        try:
            self.proc.stdin.write(job.encode())
            self.proc.stdin.flush()
            return json.loads(self._line(PER_FILE_SECONDS))
        except TimeoutError:
            self.stop()
            return {"src": str(src), "outcome": "hang", "seconds": time.monotonic() - start}
        except (EOFError, BrokenPipeError):
            code = self.proc.wait()
            self.stop()
            log = (self.folder.parent / f"{self.folder.name}.log").read_bytes()[-1500:].decode(errors="replace")
            return {"src": str(src), "outcome": f"worker died (exit {code})", "message": log}
        finally:
            if self.proc is None:
                for p in self.folder.iterdir():
                    p.unlink()

    def stop(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
            self.log.close()


def make_corpus(folder: Path):
    """Writes every mutated file into ``folder``; returns [(path, base, label, target)]."""
    import malinn

    rng = random.Random(SEED)
    members = keras_members()
    legacy = legacy_h5_from_keras(members)
    (folder / "base.h5").write_bytes(legacy)
    malinn.convert(DIGITS, folder / "base.malinn", target="cpu")
    native = (folder / "base.malinn").read_bytes()
    corpora = [
        ("keras", ".keras", keras_corpus(members, rng, COUNTS["keras"])),
        ("h5", ".h5", h5_corpus(legacy, rng, COUNTS["h5"])),
        ("malinn", ".malinn", malinn_corpus(native, rng, COUNTS["malinn"])),
    ]
    files = []
    for base, suffix, corpus in corpora:
        for i, (label, data) in enumerate(corpus):
            path = folder / f"{base}-{i:04d}{suffix}"
            path.write_bytes(data)
            files.append((path, base, label, TARGETS[len(files) % len(TARGETS)]))
    return files


def test_the_base_files_convert_to_the_same_model(tmp_path):
    """The three valid files are what the mutations start from: each converts, to equal weights."""
    import malinn

    members = keras_members()
    (tmp_path / "m.h5").write_bytes(legacy_h5_from_keras(members))
    malinn.convert(DIGITS, tmp_path / "a.malinn", target="cpu")
    malinn.convert(tmp_path / "m.h5", tmp_path / "b.malinn", target="cpu")
    malinn.convert(tmp_path / "a.malinn", tmp_path / "c.malinn", target="gpu")
    weights = [malinn.load_model(tmp_path / f"{n}.malinn").get_weights() for n in "abc"]
    assert len(weights[0]) == 6  # three Dense layers (the BatchNormalization folded in)
    for other in weights[1:]:
        for w0, w1 in zip(weights[0], other):
            np.testing.assert_array_equal(w0, w1)


def test_mutated_model_files_raise_only_conversion_error(tmp_path):
    files = make_corpus(tmp_path)
    assert len(files) >= 1000
    outcomes = [None] * len(files)
    workers = [Worker(tmp_path / f"worker{i}") for i in range(WORKERS)]
    for w in workers:
        w.folder.mkdir()
    next_index = iter(range(len(files)))
    lock = threading.Lock()

    def run(worker):
        while True:
            with lock:
                i = next(next_index, None)
            if i is None:
                return
            path, _, _, target = files[i]
            outcomes[i] = worker.convert(path, target)

    threads = [threading.Thread(target=run, args=(w,)) for w in workers]
    start = time.monotonic()
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for w in workers:
            w.stop()
    elapsed = time.monotonic() - start

    failures, tally = [], {}
    for (path, base, label, target), answer in zip(files, outcomes):
        outcome = answer["outcome"]
        tally[(base, outcome)] = tally.get((base, outcome), 0) + 1
        where = f"{path.name} ({base}, {label}, target {target})"
        if outcome == "ok":
            if answer.get("reload_error") or answer["left"] != ["out.malinn"]:
                failures.append(
                    f"{where}: converted, but the output is not a complete model file: "
                    f"{answer.get('reload_error')}; folder holds {answer['left']}"
                )
        elif outcome == "ConversionError":
            if answer["left"]:
                failures.append(f"{where}: a failed conversion left {answer['left']}")
            if path.name not in answer["message"]:
                failures.append(f"{where}: the message does not name the file: {answer['message']}")
        else:
            failures.append(f"{where}: {outcome}: {answer.get('message', '')}\n{answer.get('traceback', '')}")
    slowest = max(outcomes, key=lambda a: a.get("seconds", 0))
    summary = (
        f"{len(files)} files in {elapsed:.1f} s; slowest {slowest.get('seconds', 0):.2f} s "
        f"({Path(slowest['src']).name}); outcomes {sorted(tally.items())}"
    )
    print(summary)
    if os.environ.get("MALINN_FUZZ_REPORT"):
        Path(os.environ["MALINN_FUZZ_REPORT"]).write_text(
            json.dumps(
                [
                    dict(answer, base=base, label=label, target=target)
                    for (path, base, label, target), answer in zip(files, outcomes)
                ],
                indent=0,
            )
        )
    assert not failures, f"{len(failures)} failures ({summary}):\n" + "\n".join(failures[:15])
    # the mutations matter: most files are rejected, in every corpus
    for base in COUNTS:
        rejected = tally.get((base, "ConversionError"), 0)
        assert rejected >= COUNTS[base] // 2, summary


if __name__ == "__main__" and "--worker" in sys.argv:
    sys.exit(worker_main())
