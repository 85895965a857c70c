"""malinn's version (the package's, and the one model files record)."""

__version__ = "0.1.0"
