"""Sequence models host to host: an Embedding + LSTM text classifier, a Bidirectional GRU classifier
and a Transformer encoder, malinn beside torch (CUDA) or TensorFlow-cpu in the same run.

The models are built by Keras in a child process (TensorFlow never shares a process with PoCL) and
saved as ``.keras`` files, with a sample input and Keras's outputs on it, into a folder; ``--models
DIR`` reuses a folder saved before (a machine without TensorFlow times the files another one saved).
malinn loads each file, checks its outputs against Keras's (``max_error``, relative to
``max(1, |y|)``), and times ``predict`` (upload, run, download) at batch 1 and 32. The peer is torch
with CUDA where importable (``nn.LSTM``, a bidirectional ``nn.GRU``, ``nn.TransformerEncoder`` of
the same shapes, fp32, TF32 off), else TensorFlow-cpu timing the saved model's own call.

``--attention`` times instead the attention kernels of the library on the Transformer encoder's
MultiHeadAttention (sequence 128, width 256, 4 heads of 64, batch 32; ``--attention-shape`` another):
each kernel (``attention``, ``attention_tiled`` in its defines and its ``candidates``) chosen with
``malinn.use`` in turn, the device time of the plan's attention launch (OpenCL profiling events, the
median of ``--repeat`` rounds, the kernels interleaved in each), and the largest difference of its
output from the ``attention`` kernel's and from numpy's; writes
``benchmarks/results/sequence_attention_<device>.json``.

    python benchmarks/sequence.py [--quick] [--device gpu] [--models DIR] [--save-models DIR]
    python benchmarks/sequence.py --attention [--device gpu] [--attention-shape B,T,WIDTH,HEADS,KEY_DIM]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import harness
import numpy as np

import malinn

#: name -> (the Keras code building ``model``, the input's sample shape, whether the input is indices)
MODELS = {
    "lstm_text": (
        """
inp = keras.Input((200,))
h = keras.layers.Embedding(20000, 128)(inp)
model = keras.Model(inp, keras.layers.Dense(1, activation="sigmoid")(keras.layers.LSTM(128)(h)))
""",
        (200,),
        True,
    ),
    "bigru_text": (
        """
inp = keras.Input((200,))
h = keras.layers.Embedding(20000, 128)(inp)
h = keras.layers.Bidirectional(keras.layers.GRU(64))(h)
model = keras.Model(inp, keras.layers.Dense(1, activation="sigmoid")(h))
""",
        (200,),
        True,
    ),
    "transformer_encoder": (
        """
inp = keras.Input((128, 256))
h = inp
for _ in range(2):   # post-norm blocks, as torch's nn.TransformerEncoderLayer (norm_first=False)
    a = keras.layers.MultiHeadAttention(4, 64)(h, h)
    h = keras.layers.LayerNormalization(epsilon=1e-5)(keras.layers.Add()([h, a]))
    f = keras.layers.Dense(256)(keras.layers.Dense(512, activation="relu")(h))
    h = keras.layers.LayerNormalization(epsilon=1e-5)(keras.layers.Add()([h, f]))
model = keras.Model(inp, h)
""",
        (128, 256),
        False,
    ),
}
BATCHES = (1, 32)


def sample(shape: tuple, indices: bool, batch: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if indices:
        return rng.integers(1, 20000, (batch,) + shape).astype(np.float32)
    return rng.standard_normal((batch,) + shape).astype(np.float32)


def save_models(folder: Path) -> None:
    """Builds and saves every model with Keras in a child process, with a sample and Keras's outputs."""
    code = f"""
import os, sys, numpy as np
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
os.environ["CUDA_VISIBLE_DEVICES"] = ""
import keras
sys.path.insert(0, {str(Path(__file__).parent)!r})
from sequence import MODELS, sample
folder = {str(folder)!r}
for name, (source, shape, indices) in MODELS.items():
    keras.utils.set_random_seed(1)
    scope = {{"keras": keras}}
    exec(source, scope)
    model = scope["model"]
    x = sample(shape, indices, 4, seed=2)
    model.save(os.path.join(folder, name + ".keras"))
    np.savez(os.path.join(folder, name + ".npz"), x=x, y=model.predict(x, verbose=0))
print(keras.__version__)
"""
    folder.mkdir(parents=True, exist_ok=True)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"Keras could not build the models (pass --models DIR saved elsewhere):\n{out.stderr[-3000:]}")


def torch_peer(torch, name: str, batch: int, repeat: int) -> float:
    """Median seconds of the torch model of ``name`` on a host batch, host to host."""
    nn, dev = torch.nn, torch.device("cuda")
    if name == "transformer_encoder":
        layer = nn.TransformerEncoderLayer(256, 4, 512, dropout=0.0, batch_first=True)
        model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        head = None
    else:
        rnn = (
            nn.LSTM(128, 128, batch_first=True)
            if name == "lstm_text"
            else nn.GRU(128, 64, batch_first=True, bidirectional=True)
        )
        model = nn.ModuleDict({"embedding": nn.Embedding(20000, 128), "rnn": rnn})
        head = nn.Linear(128, 1)
    model = model.to(dev).eval()
    head = head.to(dev).eval() if head is not None else None
    _, shape, indices = MODELS[name]
    x = sample(shape, indices, batch)

    def run():
        with torch.no_grad():
            t = torch.from_numpy(x).to(dev)
            if head is None:
                y = model(t)
            else:
                _, h = model["rnn"](model["embedding"](t.long()))
                h = h[0] if isinstance(h, tuple) else h  # an LSTM's (h, c)
                y = torch.sigmoid(head(torch.cat(list(h), -1)))  # the last state (both ways: concatenated)
            return y.cpu().numpy()

    return harness.median_time(run, repeat, warmup=3)


def tensorflow_peer(folder: Path, name: str, batch: int, repeat: int) -> dict | None:
    _, shape, indices = MODELS[name]
    # Keras's own predict (a compiled function; the eager call of a recurrent layer loops in Python)
    code = (
        f"import keras\n_model = keras.saving.load_model({str(folder / (name + '.keras'))!r})\n"
        + ("_map = lambda x: np.floor(x * 19999) + 1\n" if indices else "_map = lambda x: x\n")
        + "model = lambda x: tf.convert_to_tensor(_model.predict(_map(x), batch_size=len(x), verbose=0))\n"
    )
    return harness.tensorflow_model_times(code, (batch,) + shape, repeat)


#: the Transformer encoder's attention: batch, sequence, width, heads, key_dim
ATTENTION_SHAPE = (32, 128, 256, 4, 64)


def attention_kernels() -> list:
    """``(label, codename, defines)`` of every attention kernel of the library: each entry in its
    defines, then in each of its ``candidates``."""
    from malinn.library.kernel_library import load_library

    library, found = load_library(), []
    for codename in library.codenames("attention"):
        spec = library[codename]
        for overrides in ({},) + tuple(spec.candidates):
            label = codename + "".join(f" {k}={v}" for k, v in overrides.items())
            found.append((label, codename, dict(overrides)))
    return found


def _attention_reference(layer, x: np.ndarray) -> np.ndarray:
    """numpy's MultiHeadAttention of ``x`` over itself (float64, no mask) with the layer's weights."""
    w = {name: getattr(layer, name).astype(np.float64) for name in layer.weight_names}
    q, k, v = (
        np.einsum("btd,dhk->bhtk", x, w[f"{n}_kernel"]) + w[f"{n}_bias"][None, :, None]
        for n in ("query", "key", "value")
    )
    scores = np.einsum("bhtk,bhsk->bhts", q, k) / np.sqrt(layer.key_dim)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    out = np.einsum("bhts,bhsk->bthk", p, v)
    return np.einsum("bthk,hko->bto", out, w["output_kernel"]) + w["output_bias"]


def time_attention(device, shape: tuple, repeat: int) -> list:
    """Rows of the device time of the attention launch of a MultiHeadAttention of ``shape`` (batch,
    sequence, width, heads, key_dim) under each attention kernel (:func:`attention_kernels`), timed in
    turn in each round; each row with its output's largest difference from the ``attention`` kernel's
    and numpy's (relative to ``max(1, |y|)``)."""
    from malinn.choice import kernel_choice

    batch, sequence, width, heads, key_dim = shape
    x_in = malinn.Input((sequence, width))
    layer = malinn.layers.MultiHeadAttention(heads, key_dim)
    model = malinn.Functional(x_in, layer(x_in, x_in))
    rng = np.random.default_rng(0)
    layer.set_weights(
        [(rng.standard_normal(w.shape) / np.sqrt(w.shape[0])).astype(np.float32) for w in layer.get_weights()]
    )
    x = rng.standard_normal((batch, sequence, width)).astype(np.float32)
    want = _attention_reference(layer, x.astype(np.float64))
    scale = max(1.0, float(np.abs(want).max()))
    launches, rows, first = {}, {}, None
    for label, codename, config in attention_kernels():
        kernel_choice.use("attention", codename, device, config)
        got = model.predict(x, verbose=0)
        plan = model.plan(batch, device)
        found = [launch for launch in plan.launches if launch.function == codename]
        ran = [step.spec for step in plan.steps if step.kind.name == "attention"]
        if len(found) != 1 or any(ran[0].config.get(k) != str(v) for k, v in config.items()):
            # the layer's defines do not fit this configuration (head size, local memory, queries per block)
            print(json.dumps({"kernel": label, "skipped": f"the plan runs {ran[0].codename} {ran[0].config}"}))
            continue
        first = got if first is None else first
        launches[label] = found[0]
        rows[label] = {
            "kernel": label,
            "defines": {k: ran[0].config[k] for k in ("BQ", "BK", "MAXD") if k in ran[0].config},
            "global": list(found[0].global_size),
            "local": list(found[0].local_size or ()),
            "max_error": float(np.abs(got - want).max()) / scale,
            "max_difference_from_attention": float(np.abs(got - first).max()) / scale,
        }
    kernel_choice.forget(device)
    times: dict = {label: [] for label in launches}
    labels = list(launches)
    for i in range(repeat + 1):  # the first round warms up
        for label in labels[i % len(labels) :] + labels[: i % len(labels)]:
            with device.lock:
                event = launches[label].enqueue()
                device.finish()
            if i:
                times[label].append((event.profile.end - event.profile.start) * 1e-9)
    base = float(np.median(times[labels[0]]))
    for label in labels:
        ms = float(np.median(times[label])) * 1e3
        rows[label].update({"shape": dict(zip(("batch", "sequence", "width", "heads", "key_dim"), shape)), "ms": ms})
        rows[label]["speedup_over_attention"] = base * 1e3 / ms
        print(json.dumps(rows[label]))
    return [rows[label] for label in labels]


def main(argv=None) -> None:
    parser = harness.arguments(__doc__, repeat=20, quick_repeat=3)
    parser.add_argument("--models", metavar="DIR", help="reuse the .keras files saved in DIR (no TensorFlow needed)")
    parser.add_argument("--save-models", metavar="DIR", help="save the models into DIR and keep them")
    parser.add_argument(
        "--attention", action="store_true", help="time the library's attention kernels on one layer (no models)"
    )
    parser.add_argument(
        "--attention-shape",
        metavar="B,T,WIDTH,HEADS,KEY_DIM",
        default=",".join(map(str, ATTENTION_SHAPE)),
        help="with --attention: batch, sequence, width, heads and head size (default: the encoder's, %(default)s)",
    )
    args = harness.parse(parser, argv)
    device = harness.devices(args.device)[0]
    if args.attention:
        shape = tuple(int(v) for v in args.attention_shape.split(","))
        rows = time_attention(device, shape, args.repeat)
        harness.save("sequence_attention", device, rows, args)
        return
    temporary = None
    if args.models:
        folder = Path(args.models)
    else:
        folder = Path(args.save_models) if args.save_models else Path(temporary := tempfile.mkdtemp(prefix="seq_"))
        save_models(folder)
    torch = harness.torch_cuda()
    rows = []
    for name in MODELS:
        model = malinn.load_model(str(folder / f"{name}.keras"))
        reference = np.load(folder / f"{name}.npz")
        got = model.predict(reference["x"], verbose=0)
        want = reference["y"]
        error = float(np.max(np.abs(got - want)) / max(1.0, float(np.max(np.abs(want)))))
        _, shape, indices = MODELS[name]
        for batch in BATCHES:
            x = sample(shape, indices, batch)
            model.predict(x, verbose=0)
            seconds = harness.median_time(lambda: model.predict(x, verbose=0), args.repeat, warmup=2)
            row = {"model": name, "batch": batch, "malinn_ms": seconds * 1e3, "max_error": error}
            if torch is not None:
                row["peer"], row["peer_ms"] = (
                    f"torch {torch.__version__} (CUDA, TF32 off)",
                    torch_peer(torch, name, batch, args.repeat) * 1e3,
                )
            else:
                tf = tensorflow_peer(folder, name, batch, args.repeat)
                if tf is not None:
                    row["peer"], row["peer_ms"] = f"TensorFlow-cpu {tf['version']}", tf["seconds"] * 1e3
            if "peer_ms" in row:
                row["ratio"] = row["malinn_ms"] / row["peer_ms"]
            rows.append(row)
            print(json.dumps(row))
    harness.save("sequence", device, rows, args, models=str(folder) if temporary is None else None)
    if temporary is not None:
        for path in Path(temporary).iterdir():
            os.unlink(path)
        os.rmdir(temporary)


if __name__ == "__main__":
    main()
