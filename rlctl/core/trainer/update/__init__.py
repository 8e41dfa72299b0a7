"""One optimizer step: the jitted update and its fused AdamW."""
