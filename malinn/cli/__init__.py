"""The ``malinn`` command: ``commands.py`` parses and runs it (:func:`main`), ``tf_reference.py`` is
the child process in which ``malinn verify`` runs Keras."""

from .commands import main

__all__ = ["main"]
