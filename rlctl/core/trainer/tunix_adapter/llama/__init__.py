"""The Llama architecture's own numerics in rlctl (Llama, Mistral, Qwen 2 run on Tunix's
Llama model): the update's decoder layer with its MLP gradient, the packed MLP rows and
head, the weights-first decode, the scanned layers. A family's record
(rlctl/core/families) says which of them it may use."""
