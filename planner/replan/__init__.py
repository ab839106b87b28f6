"""Online replanning: whether and how to repartition a running job (``online``), the
candidates it weighs (``candidates``), and what a migration sends and costs (``migration``)."""
