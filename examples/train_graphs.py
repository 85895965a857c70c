"""Train the two Keras Functional models that examples/graphs_convert_and_predict.py converts
(needs TensorFlow and scikit-learn).

* ``residual_mlp.keras``: a residual MLP on scikit-learn's digits (two blocks of
  Dense-Dense-Add-ReLU); ``residual_test.npz``: held-out images (x), labels (y), Keras's
  probabilities (keras).
* ``tabular_two_inputs.keras``: a two-input tabular classifier (a numeric branch and a one-hot
  category branch, concatenated); ``tabular_test.npz``: held-out ``numeric``, ``category``
  (one-hot), labels (y), Keras's probabilities (keras). The data are synthetic: the label depends
  on the numeric features and on the category.

Run:  python3 examples/train_graphs.py     (pip install tensorflow-cpu scikit-learn)
"""

import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

HERE = Path(__file__).resolve().parent
L = keras.layers


def residual_mlp():
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(x, digits.target, test_size=0.2, random_state=0)
    keras.utils.set_random_seed(0)
    inputs = keras.Input((64,), name="pixels")
    h = L.Dense(32, activation="relu", name="stem")(inputs)
    for i in (1, 2):
        g = L.Dense(32, activation="relu", name=f"block{i}_a")(h)
        g = L.Dense(32, name=f"block{i}_b")(g)
        h = L.Activation("relu", name=f"block{i}_relu")(L.Add(name=f"block{i}_add")([h, g]))
    outputs = L.Dense(10, activation="softmax", name="classes")(L.Dropout(0.1, name="drop")(h))
    model = keras.Model(inputs, outputs, name="residual_mlp")
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x_train, y_train, epochs=30, batch_size=32, verbose=0)
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    model.save(HERE / "residual_mlp.keras")
    np.savez(HERE / "residual_test.npz", x=x_test, y=y_test, keras=model.predict(x_test, verbose=0))
    print(f"residual MLP: test accuracy {accuracy:.3f}")


def tabular():
    rng = np.random.default_rng(0)
    n, categories = 2000, 4
    numeric = rng.standard_normal((n, 6)).astype(np.float32)
    category = rng.integers(0, categories, n)
    score = numeric @ np.array([1.0, -0.5, 0.8, 0.0, 0.3, -1.2]) + np.array([-1.0, 0.5, 1.5, 0.0])[category]
    y = (score + 0.3 * rng.standard_normal(n) > 0).astype(np.float32)
    onehot = np.eye(categories, dtype=np.float32)[category]
    split = int(0.8 * n)
    keras.utils.set_random_seed(0)
    num_in, cat_in = keras.Input((6,), name="numeric"), keras.Input((categories,), name="category")
    num = L.Dense(16, activation="relu", name="numeric_dense")(L.BatchNormalization(name="numeric_norm")(num_in))
    cat = L.Dense(4, name="category_embedding", use_bias=False)(cat_in)
    h = L.Dense(16, activation="relu", name="joint")(L.Concatenate(name="features")([num, cat]))
    model = keras.Model(
        [num_in, cat_in], L.Dense(1, activation="sigmoid", name="probability")(h), name="tabular_two_inputs"
    )
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    model.fit([numeric[:split], onehot[:split]], y[:split], epochs=20, batch_size=32, verbose=0)
    _, accuracy = model.evaluate([numeric[split:], onehot[split:]], y[split:], verbose=0)
    model.save(HERE / "tabular_two_inputs.keras")
    np.savez(
        HERE / "tabular_test.npz",
        numeric=numeric[split:],
        category=onehot[split:],
        y=y[split:],
        keras=model.predict([numeric[split:], onehot[split:]], verbose=0),
    )
    print(f"tabular two-input model: test accuracy {accuracy:.3f}")


if __name__ == "__main__":
    residual_mlp()
    tabular()
    print(f"wrote residual_mlp.keras, residual_test.npz, tabular_two_inputs.keras, tabular_test.npz to {HERE}")
