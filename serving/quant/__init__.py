"""Quantized weights: ``fp8`` (block-FP8 bytes and their 128x128 scales), ``fp8_layout`` (a
checkpoint's FP8 layout checked from its headers), ``fp8_gemm`` (the weight-streaming FP8
GEMM of decode and verify rows) and ``gemm`` (the one dispatch point of every projection).
"""
