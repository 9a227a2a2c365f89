"""Speculative decoding: ``tree`` (draft trees), ``drafters`` (n-gram, layer skip, the MTP
module), ``ngram_index`` (prompt lookup without rescans), ``mtp`` (what the MTP module carries
between steps) and ``accept`` (on-device acceptance of a verified tree).
"""
