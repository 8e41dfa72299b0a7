"""Completions for a step: the batch, the native sampler and vLLM behind one engine choice."""
