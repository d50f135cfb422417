"""The dictionary core: what SAEs and transcoders share (their training loop,
:mod:`interp.dictionaries.training`). It imports only the foundation, the models and the engine."""
