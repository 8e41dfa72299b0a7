"""The policy model: where its weights come from, its tokenizer, the dtype its matmuls
read."""
