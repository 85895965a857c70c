"""Functional graphs: convert a residual MLP and a two-input tabular model with `malinn convert`,
predict with malinn and compare with the probabilities Keras computed (examples/train_graphs.py).

The residual model takes one array; the tabular one takes its inputs as a dict by name (a list
in input order works too), as Keras does.

Run:  python3 examples/graphs_convert_and_predict.py [--device cpu|gpu|P:D|name]
"""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import malinn

HERE = Path(__file__).resolve().parent


def convert(name: str, folder: Path, device) -> Path:
    converted = folder / f"{name}.malinn"
    command = [sys.executable, "-m", "malinn.cli", "convert", str(HERE / f"{name}.keras"), "-o", str(converted)]
    command += ["--device", device] if device else []
    print(f"$ malinn convert examples/{name}.keras -o {name}.malinn", flush=True)
    subprocess.run(command, check=True)
    return converted


def compare(label: str, probabilities, data) -> bool:
    keras = data["keras"]
    error = float(np.abs(probabilities - keras).max())
    if keras.shape[1] == 1:
        ours, theirs = probabilities[:, 0] > 0.5, keras[:, 0] > 0.5
    else:
        ours, theirs = probabilities.argmax(1), keras.argmax(1)
    agree = float((ours == theirs).mean())
    accuracy = float((ours == data["y"]).mean())
    print(
        f"{label}: {len(keras)} test samples, accuracy {accuracy:.3f}; same class as Keras for {agree:.1%}; "
        f"max |malinn - keras| = {error:.2e}"
    )
    return agree == 1.0 and error <= 1e-5


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", help="gpu, cpu, P:D or part of a device name (default: first GPU, else CPU)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        residual_file = convert("residual_mlp", Path(tmp), args.device)
        tabular_file = convert("tabular_two_inputs", Path(tmp), args.device)
        if args.device:
            malinn.set_device(args.device)
        residual = malinn.load_model(residual_file)
        tabular = malinn.load_model(tabular_file)
    residual.summary()
    tabular.summary()
    digits = np.load(HERE / "residual_test.npz")
    table = np.load(HERE / "tabular_test.npz")
    ok = compare("residual MLP", residual.predict(digits["x"]), digits)
    by_name = tabular.predict({"numeric": table["numeric"], "category": table["category"]})
    np.testing.assert_array_equal(by_name, tabular.predict([table["numeric"], table["category"]]))
    ok = compare("two-input tabular model", by_name, table) and ok
    print(f"device: {malinn.get_device().name}")
    if not ok:
        print("MISMATCH against Keras", file=sys.stderr)
        return 1
    print("OK: malinn agrees with Keras on both graphs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
