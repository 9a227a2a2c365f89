"""Speculative decoding: ``tree`` (draft trees), ``drafters`` (n-gram, layer skip, the MTP
module), ``ngram_index`` (prompt lookup without rescans), ``mtp`` (what the MTP module carries
between steps), ``accept`` (on-device greedy acceptance of a verified tree) and ``rejection``
(speculative sampling of a verified tree: lossless under temperature, top-p, top-k and min-p).
"""
