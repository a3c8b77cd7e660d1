"""Quantization (export extra): int8 / fp8 / fp16 copies of an fp32 bundle and their quality report."""
