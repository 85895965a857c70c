"""The user's job: convert a trained Keras model with `malinn convert`, then predict with malinn.

Converts examples/digits_mlp.keras (made by train_digits.py) into a malinn model file with the
`malinn` command, loads it with numpy, pyopencl and h5py only (as a board would), classifies the
held-out digits and compares with the probabilities Keras computed when the model was trained.

Run:  python3 examples/convert_and_predict.py [--device cpu|gpu|P:D|name] [--target KERNEL]
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
    parser.add_argument(
        "--target", help="matmul kernel or gpu/cpu whose layouts the file stores (default: the device's)"
    )
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        converted = Path(tmp) / "digits_mlp.malinn"
        command = [sys.executable, "-m", "malinn.cli", "convert", str(HERE / "digits_mlp.keras"), "-o", str(converted)]
        command += ["--device", args.device] if args.device else []
        command += ["--target", args.target] if args.target else []
        print(f"$ malinn convert examples/digits_mlp.keras -o {converted}   (a temporary folder)", flush=True)
        subprocess.run(command, check=True)

        if args.device:
            malinn.set_device(args.device)
        model = malinn.load_model(converted)
        model.summary()
        data = np.load(HERE / "digits_test.npz")
        probabilities = model.predict(data["x"])

    device = malinn.get_device()
    error = float(np.abs(probabilities - data["keras"]).max())
    agree = float((probabilities.argmax(1) == data["keras"].argmax(1)).mean())
    accuracy = float((probabilities.argmax(1) == data["y"]).mean())
    print(f"device: {device.name}; matmul kernel: {malinn.ops.kernel_for('matmul').codename}")
    print(
        f"{len(data['x'])} test digits: accuracy {accuracy:.3f}; same class as Keras for {agree:.1%}; "
        f"max |malinn - keras| = {error:.2e}"
    )
    if agree < 1.0 or error > 1e-5:
        print("MISMATCH against Keras", file=sys.stderr)
        return 1
    print("OK: malinn agrees with Keras on every test digit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
