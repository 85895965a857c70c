"""The kernel library: kernels/library.json read and validated, the layout grammar, the weight
precisions."""
