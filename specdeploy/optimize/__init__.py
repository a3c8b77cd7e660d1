"""Graph optimization for ONNX Runtime, a step of its own beside quantization: fused rotary, norms and
sibling matmuls (fusion.py), each layer's attention as one kernel where its rows stay independent
(attention.py, attention_match.py, gqa_probe.py)."""
