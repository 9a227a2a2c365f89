"""Gates of phase ``backend``: ``verify`` (gate ``greedy``) and ``benchmark`` (gate ``decode-speed``)."""
