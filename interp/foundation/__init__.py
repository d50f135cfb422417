"""Layer 0, the foundation: text, sizes, files and shard partials. No torch, no model:
every other layer may import these, and the command line checks its arguments with them
before anything heavy is loaded."""
