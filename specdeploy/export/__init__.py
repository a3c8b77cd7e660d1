"""Export (export extra): split a Hugging Face decoder into a bundle of draft / verify / head graphs.

    from specdeploy.export import ExportConfig, export
    export(ExportConfig(source="model-dir-or.gguf", exit_layer=8))

`export()` is the one entry point; `pipeline.py` orchestrates, the other modules are its steps.
"""
from .pipeline import ExportConfig, export

__all__ = ["ExportConfig", "export"]
