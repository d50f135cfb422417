"""Attribution graphs: a prompt's local replacement model, the direct effects between its
transcoder features, errors, tokens and logits, and the method's pruning and scores."""
