"""Qwen3.5's text model (gated DeltaNet and gated attention layers) in Flax NNX, Tunix's style."""
