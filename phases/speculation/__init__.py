"""Phase ``speculation``: speculative decoding that pays, on a model that has learnt something."""
