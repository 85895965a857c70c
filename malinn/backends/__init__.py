"""Backends: one module per GPU API, each the only importer of that API: ``opencl.py`` (pyopencl),
``opengl.py`` (OpenGL compute shaders through moderngl, on an OpenGL ES 3.1 or desktop 4.3 context
that ``gles_context.py`` makes), ``gl_feedback.py`` (OpenGL ES 3.0's vertex shaders and transform
feedback: boards without compute shaders).

``base.py`` is the interface every backend's devices implement; ``docs/BACKENDS.md`` says what a
new backend must provide.
"""
