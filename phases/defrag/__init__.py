"""Phase ``defrag``: the ``integrity`` (verify) and ``speed`` (benchmark) gates."""
