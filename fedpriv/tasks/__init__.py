"""Tasks: a model bound to its batching, per-example loss and metrics (see ``fedpriv.tasks.base``)."""
