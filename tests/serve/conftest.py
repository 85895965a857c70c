"""The serving tests' fixtures: the Keras models they serve (tests/serve/serving.py builds them)."""

from serving import keras_models  # noqa: F401 (a fixture)
