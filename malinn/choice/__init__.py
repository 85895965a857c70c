"""Which kernel runs each op on a device (explicit, tuned, the library's), the tuning database, kernels
bound to arguments and device matrices."""
