"""malinn.ray.Predictor on a local Ray cluster (two CPUs, the actors on this machine's device): the
scores Ray Data gathers equal a direct predict, from a model file and from a model object, from
numpy rows and from a Parquet data set."""

import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
from support import assert_close, small_dense_model

import malinn
from malinn import DeviceError, Functional, Input
from malinn.layers import Concatenate, Dense
from malinn.ray import RAY_HINT, Predictor, actor_devices


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield
    ray.shutdown()


def scorer(seed=0):
    return small_dense_model(seed, features=12, hidden=16, outputs=4, scale=0.5)


def by_id(rows, column="predictions"):
    rows = sorted(rows, key=lambda r: r["id"])
    return np.array([r["id"] for r in rows]), np.stack([np.asarray(r[column]) for r in rows])


def test_scores_from_a_model_file_equal_a_direct_predict(cluster, tmp_path):
    model = scorer()
    model.save(tmp_path / "scorer.malinn")
    x = np.random.default_rng(1).uniform(-1, 1, (300, 12)).astype(np.float32)
    ds = ray.data.from_items([{"id": i, "data": row} for i, row in enumerate(x)])
    scored = ds.map_batches(
        Predictor,
        fn_constructor_kwargs={"model": str(tmp_path / "scorer.malinn")},
        batch_size=64,
        compute=ray.data.ActorPoolStrategy(size=2),
        num_cpus=0.5,
    )
    rows = scored.take_all()
    ids, y = by_id(rows)
    assert ids.tolist() == list(range(300)) and "data" not in rows[0]  # the input column is dropped
    assert y.dtype == np.float32
    assert_close(y, model.predict(x))


def test_a_parquet_data_set_scored_with_a_model_object(cluster, tmp_path):
    a, b = Input((5,), name="a"), Input((3,), name="b")
    model = Functional([a, b], Dense(2, name="out")(Concatenate()([Dense(4, name="da")(a), b])))
    rng = np.random.default_rng(2)
    model.set_weights([rng.standard_normal(w.shape).astype(np.float32) for w in model.get_weights()])
    xa, xb = rng.uniform(-1, 1, (120, 5)).astype(np.float32), rng.uniform(-1, 1, (120, 3)).astype(np.float32)
    for part in range(3):  # a data set of three files, a list column per input
        rows = slice(40 * part, 40 * part + 40)
        pq.write_table(
            pa.table({"id": np.arange(120)[rows], "a": list(xa[rows]), "b": list(xb[rows])}),
            tmp_path / f"part{part}.parquet",
        )
    scored = ray.data.read_parquet(str(tmp_path)).map_batches(
        Predictor,
        fn_constructor_kwargs={"model": model, "input_column": ["a", "b"], "output_column": "score"},
        batch_size=32,
        compute=ray.data.ActorPoolStrategy(size=1),
        num_cpus=0.5,
    )
    ids, y = by_id(scored.take_all(), "score")
    assert ids.tolist() == list(range(120))
    assert_close(y, model.predict([xa, xb]))


def test_a_predictor_outside_ray_and_the_gpus_ray_assigns(tmp_path):
    model = scorer(3)
    x = np.random.default_rng(4).uniform(-1, 1, (10, 12)).astype(np.float32)
    batch = Predictor(model)({"data": x, "key": np.arange(10)})
    assert sorted(batch) == ["key", "predictions"]
    np.testing.assert_array_equal(batch["predictions"], model.predict(x))
    assert actor_devices([]) is None
    gpus = [d for d in malinn.devices() if d.kind == "gpu"]
    for gpu in gpus[:1]:  # a GPU id of this node: that GPU
        assert actor_devices([gpus.index(gpu)]) in ([gpu], gpus)
    beyond = list(range(len(gpus) + 1, 2 * len(gpus) + 2))  # more ids than GPUs, none of them here
    with pytest.raises(DeviceError, match=f"Ray assigned GPU\\(s\\) {beyond[0]}.* to this actor"):
        actor_devices(beyond)
    with pytest.raises(KeyError, match="the batch has no column 'data'; it has x"):
        Predictor(model)({"x": x})
    # a column that does not fit the model is named beside the layer and the shapes
    with pytest.raises(ValueError, match=r"^malinn.ray.Predictor, column\(s\) 'data': .*\(None, 12\).*\(10, 11\)"):
        Predictor(model)({"data": x[:, :11]})
    ragged = np.empty(2, dtype=object)
    ragged[:] = [x[0], x[1, :11]]  # a list column whose rows differ
    with pytest.raises(ValueError, match=r"column 'data' holds rows of different shapes \(\(11,\), \(12,\)\)"):
        Predictor(model)({"data": ragged})


def test_without_ray_a_predictor_says_how_to_install_it():
    """malinn.ray imports without Ray (the name is there for docs and type checks); a Predictor
    needs it and says which extra brings it."""
    code = (
        "import sys\nsys.modules['ray'] = None   # as where Ray is not installed\n"
        "from malinn.ray import Predictor\ntry:\n    Predictor('model.malinn')\nexcept ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == RAY_HINT, out.stderr
    assert RAY_HINT == "malinn.ray needs Ray Data, which is not installed: pip install 'malinn[ray]'"
