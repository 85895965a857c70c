"""One member of every keras.applications family, built by Keras 3 and by tf_keras, saved as
``.keras`` and ``.h5``, with an input and Keras's logits beside them in a ``.npz``.

Run as ``python tests/applications_zoo.py OUTDIR [NAME ...]`` (in a child process of the tests:
TensorFlow never shares a test process); writes ``OUTDIR/<generation>/<name>.keras``, ``.h5`` and
``.npz`` and, last, ``OUTDIR/manifest.json`` (the networks each generation has). The weights are Keras's initial ones with random
normalization statistics and scales (standard normal weights would grow a deep network's
activations to 1e4, where two float32 sums already differ by more than 1e-5); the logits, without
the softmax that would round most of them to 0. Each network at its smallest input. The module
level is plain data: the tests import it.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).with_name("layers")))
from zoo_files import randomize_statistics  # noqa: E402

GENERATIONS = ("keras3", "tf_keras")
SUFFIXES = (".keras", ".h5")
BATCH = 2

#: name -> input shape (without the batch): the smallest each network takes
APPLICATIONS = {
    "ConvNeXtTiny": (32, 32, 3),
    "DenseNet121": (32, 32, 3),
    "EfficientNetB0": (32, 32, 3),
    "EfficientNetV2B0": (32, 32, 3),
    "InceptionResNetV2": (75, 75, 3),
    "InceptionV3": (75, 75, 3),
    "MobileNet": (32, 32, 3),
    "MobileNetV2": (32, 32, 3),
    "MobileNetV3Small": (32, 32, 3),
    "MobileNetV3Large": (32, 32, 3),
    "NASNetMobile": (32, 32, 3),
    "RegNetX002": (32, 32, 3),
    "RegNetY002": (32, 32, 3),
    "ResNet50": (32, 32, 3),
    "ResNet50V2": (32, 32, 3),
    "VGG16": (32, 32, 3),
    "Xception": (71, 71, 3),
}


def main(outdir: str, names: list[str]) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    import keras
    import numpy as np
    import tf_keras

    out = pathlib.Path(outdir)
    built: dict[str, list[str]] = {}
    for generation, module in (("keras3", keras), ("tf_keras", tf_keras)):
        folder = out / generation
        folder.mkdir(parents=True, exist_ok=True)
        built[generation] = []
        for i, name in enumerate(names):
            shape = APPLICATIONS[name]
            if not hasattr(module.applications, name):  # Keras 3 has no RegNet
                continue
            model = getattr(module.applications, name)(weights=None, input_shape=shape, classifier_activation=None)
            randomize_statistics(model, 100 + i)
            for suffix in SUFFIXES:
                model.save(folder / f"{name}{suffix}")
            x = np.random.default_rng(i).standard_normal((BATCH,) + shape).astype(np.float32)
            np.savez(folder / f"{name}.npz", x=x, y=np.asarray(model.predict(x, verbose=0)))
            module.backend.clear_session()
            built[generation].append(name)
    manifest = {"keras": keras.__version__, "tf_keras": tf_keras.__version__, "applications": built}
    (out / "manifest.json").write_text(json.dumps(manifest))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] or list(APPLICATIONS))
