"""Experiment runs (grids over one planted corpus), the run store, and the comparison report."""
