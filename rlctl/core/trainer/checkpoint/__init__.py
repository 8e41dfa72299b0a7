"""A run's checkpoints: Orbax saves and restores, their size, memory and background
bookkeeping, and damaged ones set aside."""
