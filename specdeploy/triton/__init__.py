"""Triton Inference Server: a model repository (Python backend, decoupled) over one bundle."""
