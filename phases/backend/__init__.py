"""Gates of phase ``backend``: ``verify`` (gate ``greedy``; its comparison is ``phases.common.greedy``)
and ``tp_check`` (tensor-parallel tokens and step time, run by hand under ``torchrun``)."""
