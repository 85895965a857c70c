"""Train the small Keras CNN that examples/cnn_digits.py converts (needs TensorFlow).

Trains a convolutional network (Conv2D, BatchNormalization, MaxPooling2D, Flatten, Dense) on
scikit-learn's bundled 8x8 digits and writes, beside this script:
  digits_cnn.keras       the trained Keras 3 model
  digits_cnn_test.npz    the held-out test images (x, shape (n, 8, 8, 1)), labels (y) and Keras's
                         probabilities (keras)

Run:  python3 examples/train_digits_cnn.py     (pip install tensorflow-cpu scikit-learn)
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
    x = (digits.images / 16.0).astype(np.float32)[..., None]
    x_train, x_test, y_train, y_test = train_test_split(x, digits.target, test_size=0.2, random_state=0)
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Conv2D(32, 3, padding="same"),
            keras.layers.BatchNormalization(),
            keras.layers.Activation("relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Flatten(),
            keras.layers.Dropout(0.2),
            keras.layers.Dense(10, activation="softmax"),
        ],
        name="digits_cnn",
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x_train, y_train, epochs=20, batch_size=32, verbose=0)
    loss, accuracy = model.evaluate(x_test, y_test, verbose=0)
    model.save(HERE / "digits_cnn.keras")
    np.savez(HERE / "digits_cnn_test.npz", x=x_test, y=y_test, keras=model.predict(x_test, verbose=0))
    print(f"test accuracy {accuracy:.3f}; wrote digits_cnn.keras and digits_cnn_test.npz to {HERE}")


if __name__ == "__main__":
    main()
