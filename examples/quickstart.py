"""Build a small Dense network with random weights, run it on an OpenCL device, check it with numpy.

Run:  python3 examples/quickstart.py [--device cpu|gpu|P:D|name] [--kernel morton_4_2|...]
"""

import argparse
import sys

import numpy as np

import malinn
from malinn.layers import Dense


def numpy_forward(model, x):
    """The same network in float64 numpy: relu, relu, softmax."""
    h = x.astype(np.float64)
    weights = model.get_weights()
    for i, layer in enumerate(model.layers):
        h = h @ weights[2 * i] + weights[2 * i + 1]
        if layer.activation == "relu":
            h = np.maximum(h, 0)
        elif layer.activation == "softmax":
            h = np.exp(h - h.max(axis=1, keepdims=True))
            h /= h.sum(axis=1, keepdims=True)
    return h


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", help="gpu, cpu, P:D or part of a device name (default: first GPU, else CPU)")
    parser.add_argument("--kernel", help="matmul codename from kernels/library.json (default: the device's)")
    args = parser.parse_args(argv)

    print("working devices (OpenCL, and OpenGL where the gl extra is installed):")
    for d in malinn.devices():
        print("  ", d)
    device = malinn.set_device(args.device) if args.device else malinn.get_device()
    if args.kernel:
        malinn.ops.use("matmul", args.kernel)
    print(f"running on: {device.name}, matmul kernel: {malinn.ops.kernel_for('matmul').codename}")

    # The thesis's "Partial MNIST" network: 640-150-10 with ReLU, softmax on top.
    model = malinn.Sequential([Dense(150, activation="relu"), Dense(10, activation="softmax")], name="partial_mnist")
    model.build((None, 640))
    rng = np.random.default_rng(0)
    model.set_weights([rng.standard_normal(w.shape).astype(np.float32) * 0.05 for w in model.get_weights()])
    model.summary()

    x = rng.random((100, 640), dtype=np.float32)
    y = model.predict(x)
    expected = numpy_forward(model, x)
    error = float(np.abs(y - expected).max())
    same_class = bool((y.argmax(1) == expected.argmax(1)).all())
    print(f"predicted {y.shape}; max |malinn - numpy| = {error:.2e}; same class for every sample: {same_class}")
    if error > 1e-5 or not same_class:
        print("MISMATCH against numpy", file=sys.stderr)
        return 1
    print("OK: malinn matches numpy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
