"""Backends: one module per GPU API, each the only importer of that API (``opencl.py`` today).

``base.py`` is the interface every backend's devices implement; ``docs/BACKENDS.md`` says what a
new backend (OpenGL ES compute is next) must provide.
"""
