"""The compile passes, in the order :meth:`malinn.plan.builder.PlanBuilder.compile` runs them; each
takes the builder's steps (``builder.steps``, a list it may rewrite) and decides one thing for good."""
