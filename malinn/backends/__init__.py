"""Backends: ``opencl.py`` (the only importer of pyopencl); ``opengl.py`` (OpenGL compute shaders
through moderngl, on an OpenGL ES 3.1 or desktop 4.3 context) and ``gl_feedback.py`` (OpenGL ES 3.0's
vertex shaders and transform feedback: boards without compute shaders), over what the two share:
``gl_context.py`` (the contexts; the only importer of moderngl), ``gles_context.py`` (OpenGL ES
contexts through EGL), ``gl_functions.py`` (GL entry points through ctypes), ``gl_base.py`` (the
device, discovery's steps) and ``gl_programs.py`` (the compute shaders).

``base.py`` is the interface every backend's devices implement; ``docs/BACKENDS.md`` says what a
new backend must provide.
"""
