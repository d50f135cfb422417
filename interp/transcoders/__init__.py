"""Transcoders (per-layer and cross-layer) in circuit-tracer's format: load, check, save."""
