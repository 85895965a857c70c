"""``malinn tune``: timing candidate kernels and configurations on a device, storing the winners."""
