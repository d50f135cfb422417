"""Layer 1, model access: loading checkpoints and hub names into a TransformerBridge
(``loading``, ``sources``), norms and their frozen scales (``norms``), LayerNorm/RMSNorm
folding (``layernorm``) and device offload (``offload``)."""
