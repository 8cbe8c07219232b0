"""PyTorch plugins: the cpu, cuda and mps backends, the FLOP/byte counter and the Tier 1 stage hooks for torch models."""
