"""Split a Hugging Face decoder into draft / verify / head ONNX graphs (needs the export extra)."""
