"""Planning: a model lowered to steps with every choice made once per model, device and batch
(``builder``), then allocated and bound into the compiled plan that ``predict`` runs (``plan``)."""
