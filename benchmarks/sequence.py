"""Sequence models host to host: an Embedding + LSTM text classifier, a Bidirectional GRU classifier
and a Transformer encoder, malinn beside torch (CUDA) or TensorFlow-cpu in the same run.

The models are built by Keras in a child process (TensorFlow never shares a process with PoCL) and
saved as ``.keras`` files, with a sample input and Keras's outputs on it, into a folder; ``--models
DIR`` reuses a folder saved before (a machine without TensorFlow times the files another one saved).
malinn loads each file, checks its outputs against Keras's (``max_error``, relative to
``max(1, |y|)``), and times ``predict`` (upload, run, download) at batch 1 and 32. The peer is torch
with CUDA where importable (``nn.LSTM``, a bidirectional ``nn.GRU``, ``nn.TransformerEncoder`` of
the same shapes, fp32, TF32 off), else TensorFlow-cpu timing the saved model's own call.

    python benchmarks/sequence.py [--quick] [--device gpu] [--models DIR] [--save-models DIR]
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


def main(argv=None) -> None:
    parser = harness.arguments(__doc__, repeat=20, quick_repeat=3)
    parser.add_argument("--models", metavar="DIR", help="reuse the .keras files saved in DIR (no TensorFlow needed)")
    parser.add_argument("--save-models", metavar="DIR", help="save the models into DIR and keep them")
    args = harness.parse(parser, argv)
    device = harness.devices(args.device)[0]
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
