"""A run around its steps: the loop, its evals and its metrics."""
