"""The algorithm: GRPO's and GSPO's loss, and the finite-or-stopped rule."""
