"""Benchmarks: speculative vs plain decoding on the same graphs, and against other runtimes."""
