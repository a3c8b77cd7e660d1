"""specdeploy: self-speculative decoding (early-exit drafts, exact verification) for edge LLMs."""
__version__ = "0.1.0"
