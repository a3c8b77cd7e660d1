"""One error hierarchy for everything a user can get wrong.

Every message says what is wrong *and* what to do about it; the CLI prints it as one line.
"""


class SpecDeployError(Exception):
    """Base class of all user-facing errors."""


class ConfigError(SpecDeployError, ValueError):
    """An option or parameter is out of range or inconsistent."""


class UnsupportedModelError(SpecDeployError):
    """The model's architecture cannot be split by the exporter."""


class ModelSourceError(SpecDeployError):
    """A model file or directory is missing, corrupt, or in a form the exporter cannot read."""


class BundleError(SpecDeployError):
    """A bundle on disk is missing, incomplete or from an incompatible version."""


class ValidationError(SpecDeployError):
    """Exported graphs disagree with the PyTorch reference beyond tolerance."""


class RowDependenceError(ValidationError):
    """Graphs whose rows depend on how many rows a call carries (speculative != plain output)."""


class ContextLengthError(SpecDeployError, ValueError):
    """A prompt plus the requested tokens do not fit in the bundle's KV buffers."""


class MissingDependencyError(SpecDeployError, ImportError):
    """An optional dependency is needed for this command but is not installed."""


class BackendError(SpecDeployError):
    """A backend (ONNX Runtime, TensorRT) could not load or run a graph."""


def require(module: str, extra: str, purpose: str):
    """Import an optional dependency or raise a one-line error naming the extra to install."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(
            f"{purpose} needs the Python package '{module.split('.')[0]}' ({exc}); "
            f"install it with: pip install 'specdeploy[{extra}]'"
        ) from None

