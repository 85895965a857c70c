"""A convolutional network on the board: convert a trained Keras CNN, predict, compare with Keras.

Converts examples/digits_cnn.keras (made by train_digits_cnn.py: Conv2D, BatchNormalization folded
into the convolution before it, MaxPooling2D, Flatten, Dense) into a malinn model file with the
`malinn` command, loads it with numpy, pyopencl and h5py only, classifies the held-out 8x8 digits
in one upload and one download, and checks that every sample gets Keras's class and probabilities.

Run:  python3 examples/cnn_digits.py [--device cpu|gpu|P:D|name]
"""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import malinn

HERE = Path(__file__).resolve().parent


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", help="gpu, cpu, P:D or part of a device name (default: first GPU, else CPU)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        converted = Path(tmp) / "digits_cnn.malinn"
        command = [sys.executable, "-m", "malinn.cli", "convert", str(HERE / "digits_cnn.keras"), "-o", str(converted)]
        command += ["--device", args.device] if args.device else []
        print("$ malinn convert examples/digits_cnn.keras -o digits_cnn.malinn", flush=True)
        subprocess.run(command, check=True)

        if args.device:
            malinn.set_device(args.device)
        model = malinn.load_model(converted)
        model.summary(show_kernels=True)  # and the kernels that run each layer: the convolution's algorithm
        data = np.load(HERE / "digits_cnn_test.npz")
        probabilities = model.predict(data["x"])

    error = float(np.abs(probabilities - data["keras"]).max())
    agree = probabilities.argmax(1) == data["keras"].argmax(1)
    accuracy = float((probabilities.argmax(1) == data["y"]).mean())
    print(f"device: {malinn.get_device().name}")
    print(
        f"{len(data['x'])} test digits: accuracy {accuracy:.3f}; same class as Keras for {agree.mean():.1%}; "
        f"max |malinn - keras| = {error:.2e}"
    )
    if not agree.all() or error > 1e-5:
        print(f"MISMATCH: samples {np.flatnonzero(~agree).tolist()} differ from Keras", file=sys.stderr)
        return 1
    print("OK: malinn agrees with Keras on every sample")
    return 0


if __name__ == "__main__":
    sys.exit(main())
