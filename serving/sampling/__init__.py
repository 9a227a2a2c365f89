"""Sampling: ``params`` (a request's temperature, top-p, top-k, min-p and seed, and a checkpoint's
defaults), ``rng`` (counter-based uniforms per request, position and draw) and ``sampler`` (the
processed distribution and a draw from it, on the device, capturable).

Speculative sampling over a draft tree is ``serving.speculation.rejection``.
"""

from serving.sampling.params import GREEDY, SamplingParams

__all__ = ["GREEDY", "SamplingParams"]
