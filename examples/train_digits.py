"""Train the small Keras model that examples/convert_and_predict.py converts (needs TensorFlow).

Trains a 64-32-16-10 MLP (with BatchNormalization and Dropout, as real models have) on
scikit-learn's bundled digits set and writes, beside this script:
  digits_mlp.keras   the trained Keras 3 model
  digits_test.npz    the held-out test images (x), labels (y) and Keras's probabilities (keras)

Run:  python3 examples/train_digits.py     (pip install tensorflow-cpu scikit-learn)
"""

import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

HERE = Path(__file__).resolve().parent


def main():
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(x, digits.target, test_size=0.2, random_state=0)
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(32),
            keras.layers.BatchNormalization(),
            keras.layers.Activation("relu"),
            keras.layers.Dropout(0.2),
            keras.layers.Dense(16, activation="tanh"),
            keras.layers.Dense(10, activation="softmax"),
        ],
        name="digits_mlp",
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x_train, y_train, epochs=40, batch_size=32, verbose=0)
    loss, accuracy = model.evaluate(x_test, y_test, verbose=0)
    model.save(HERE / "digits_mlp.keras")
    np.savez(HERE / "digits_test.npz", x=x_test, y=y_test, keras=model.predict(x_test, verbose=0))
    print(f"test accuracy {accuracy:.3f}; wrote digits_mlp.keras and digits_test.npz to {HERE}")


if __name__ == "__main__":
    main()
