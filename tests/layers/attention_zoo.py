"""Keras's attention models, saved by Keras 3 (.keras, .h5) and tf_keras (.h5, .keras), with inputs and
Keras's outputs: ``python tests/layers/attention_zoo.py OUTDIR [keras3|tf_keras]``.

Run as a child process (TensorFlow never shares a process with PoCL): each generation in its own
process, files ``<model>.<generation>.<format>`` and ``<model>.<generation>.npz`` (inputs ``x0, x1,
...``, Keras's output ``y``), then ``manifest.json`` naming them. Models: MultiHeadAttention self-
and cross-attention with a separate key, an explicit attention mask holding a query that may attend
to nothing, causal masks, output_shape, one head of key_dim 1 on sequence 1, sequence 37 with three
heads, dropout set (Keras 3's other masked softmax), no biases; Attention (dot, scaled, concat,
causal), AdditiveAttention; a Transformer encoder block and a decoder block (causal self-attention,
cross-attention) of MultiHeadAttention, Add, LayerNormalization and a Dense feed-forward.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np


def models(keras):
    L = keras.layers
    rng = np.random.default_rng(7)
    made = {}

    def inputs(*shapes):
        return [keras.Input(s) for s in shapes]

    q, v, m = inputs((5, 8), (7, 6), (5, 7))
    made["mha_cross_mask"] = (
        keras.Model([q, v, m], L.MultiHeadAttention(2, 3, value_dim=4)(q, v, attention_mask=m)),
        [(2, 5, 8), (2, 7, 6), "mask:2,5,7"],
    )
    (q,) = inputs((6, 5))
    made["mha_self_causal"] = (
        keras.Model(q, L.MultiHeadAttention(3, 2, output_shape=4)(q, q, use_causal_mask=True)),
        [(3, 6, 5)],
    )
    q, v, k, m = inputs((4, 5), (6, 3), (6, 2), (4, 6))
    made["mha_key_mask_causal"] = (
        keras.Model(
            [q, v, k, m],
            L.MultiHeadAttention(2, 4, use_bias=False)(q, v, key=k, attention_mask=m, use_causal_mask=True),
        ),
        [(2, 4, 5), (2, 6, 3), (2, 6, 2), "mask:2,4,6"],
    )
    (q,) = inputs((1, 3))
    made["mha_one"] = (keras.Model(q, L.MultiHeadAttention(1, 1)(q, q)), [(1, 1, 3)])
    (q,) = inputs((37, 6))
    made["mha_37"] = (keras.Model(q, L.MultiHeadAttention(3, 5)(q, q)), [(2, 37, 6)])
    q, m = inputs((4, 5), (4, 4))
    made["mha_dropout_mask"] = (
        keras.Model([q, m], L.MultiHeadAttention(2, 3, dropout=0.3)(q, q, attention_mask=m)),
        [(2, 4, 5), "mask:2,4,4"],
    )
    q, v = inputs((5, 4), (7, 4))
    made["attention_dot"] = (keras.Model([q, v], L.Attention()([q, v])), [(2, 5, 4), (2, 7, 4)])
    made["attention_scaled_causal"] = (
        keras.Model([q, v], L.Attention(use_scale=True)([q, v], use_causal_mask=True)),
        [(2, 5, 4), (2, 7, 4)],
    )
    made["attention_concat"] = (
        keras.Model([q, v], L.Attention(use_scale=True, score_mode="concat")([q, v])),
        [(2, 5, 4), (2, 7, 4)],
    )
    made["additive_attention"] = (keras.Model([q, v], L.AdditiveAttention()([q, v])), [(2, 5, 4), (2, 7, 4)])

    def encoder(x, width, heads, ff):
        a = L.MultiHeadAttention(heads, width // heads)(x, x)
        x = L.LayerNormalization(epsilon=1e-6)(L.Add()([x, a]))
        f = L.Dense(width)(L.Dense(ff, activation="relu")(x))
        return L.LayerNormalization(epsilon=1e-6)(L.Add()([x, f]))

    (x,) = inputs((9, 16))
    made["encoder"] = (keras.Model(x, encoder(encoder(x, 16, 4, 32), 16, 4, 32)), [(2, 9, 16)])
    x, memory = inputs((6, 16), (9, 16))
    a = L.MultiHeadAttention(2, 8)(x, x, use_causal_mask=True)
    h = L.LayerNormalization()(L.Add()([x, a]))
    c = L.MultiHeadAttention(2, 8)(h, memory)
    h = L.LayerNormalization()(L.Add()([h, c]))
    f = L.Dense(16)(L.Dense(24, activation="gelu")(h))
    made["decoder"] = (keras.Model([x, memory], L.LayerNormalization()(L.Add()([h, f]))), [(2, 6, 16), (2, 9, 16)])
    for name, (model, shapes) in made.items():
        for w in model.weights:  # biases and LayerNormalization's scales away from their initial values
            w.assign(
                rng.standard_normal(tuple(w.shape)).astype(np.float32) * (0.6 if len(w.shape) > 1 else 0.3)
                + (1.0 if "gamma" in w.name or "scale" in w.name else 0.0)
            )
    return made


def sample(shape, rng):
    if isinstance(shape, str):  # an attention mask with a query that may attend to nothing
        dims = tuple(int(d) for d in shape.split(":")[1].split(","))
        mask = (rng.random(dims) > 0.4).astype(np.float32)
        mask[0, 0] = 0
        return mask
    return rng.standard_normal(shape).astype(np.float32)


def generation(folder: Path, which: str) -> list:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if which == "keras3":
        import keras
    else:
        import tf_keras as keras
    rng = np.random.default_rng(11)
    written = []
    for name, (model, shapes) in models(keras).items():
        xs = [sample(s, rng) for s in shapes]
        y = np.asarray(model.predict(xs if len(xs) > 1 else xs[0], verbose=0))
        stem = f"{name}.{which}"
        np.savez(folder / f"{stem}.npz", y=y, **{f"x{i}": x for i, x in enumerate(xs)})
        for fmt in ("keras", "h5"):
            model.save(folder / f"{stem}.{fmt}")
            written.append(
                {"model": name, "generation": which, "format": fmt, "file": f"{stem}.{fmt}", "data": f"{stem}.npz"}
            )
    return written


def main() -> None:
    folder = Path(sys.argv[1])
    folder.mkdir(parents=True, exist_ok=True)
    if len(sys.argv) > 2:
        print(json.dumps(generation(folder, sys.argv[2])))
        return
    entries = []
    for which in ("keras3", "tf_keras"):  # each generation in its own process (tf_keras and Keras 3 differ)
        done = subprocess.run(
            [sys.executable, __file__, str(folder), which], capture_output=True, text=True, timeout=600
        )
        if done.returncode != 0:
            sys.exit(f"{which} failed:\n{done.stderr[-4000:]}")
        entries += json.loads(done.stdout.strip().splitlines()[-1])
    (folder / "manifest.json").write_text(json.dumps(entries, indent=1))


if __name__ == "__main__":
    main()
