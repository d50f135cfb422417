"""Sparse autoencoders (SAELens's format and conventions) on TransformerLens 4 models."""
