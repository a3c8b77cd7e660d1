"""How this ONNX Runtime's `GroupQueryAttention` counts a sliding window, checked before a bundle
whose fused attention slides runs.

The kernel's `local_window_size` is counted differently across releases, measured: ONNX Runtime
1.32's CPU kernel lets row i see keys j with i - j < local_window_size, 1.23's one key more. A
bundle quantized under one and run under the other would attend to one key too many or too few
past the window: plausible text, not the model's. So quantize records the shift it built with
(window = local_window_size + shift) and loading measures it again with a one-node probe shipped
beside this module (made by optimize.gqa_probe.window_probe_model, which needs `onnx`; the
runtime does not).
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from ..errors import BackendError

PROBE = Path(__file__).with_name("gqa_window_probe.onnx")
PROBE_WINDOW, PROBE_ROWS = 2, 8  # the probe's local_window_size and rows (q, k, v [1, rows, 16])


@functools.lru_cache(maxsize=None)
def shift() -> int:
    """Keys a row sees past `local_window_size` in this ONNX Runtime (its own included): zero
    queries weigh the visible keys equally, and one-hot values count them."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(PROBE), providers=["CPUExecutionProvider"])
    values = np.zeros((1, PROBE_ROWS, 16), np.float32)  # [B, S, D]: row j is e_j
    values[0, np.arange(PROBE_ROWS), np.arange(PROBE_ROWS)] = 1.0
    zeros, cache = np.zeros_like(values), np.zeros((1, 1, PROBE_ROWS, 16), np.float32)
    out = session.run(["out"], {"q": zeros, "k": zeros, "v": values, "past_key": cache, "past_value": cache,
                                "seqlens_k": np.array([PROBE_ROWS - 1], np.int32),
                                "total": np.array(PROBE_ROWS, np.int32)})[0]  # [1, S, 16]
    seen = int(round(1.0 / out[0, -1].max()))
    return seen - PROBE_WINDOW


def check(manifest, provider: str) -> None:
    """Refuse a bundle whose sliding-window attention was built for another count of the window."""
    built = manifest.attention_window_shift
    if built is None or provider != "cpu" or built == shift():
        return
    import onnxruntime as ort

    raise BackendError(
        f"this bundle's sliding-window attention was fused for an ONNX Runtime whose GroupQueryAttention "
        f"counts the window {'one key more' if built > shift() else 'one key less'} than onnxruntime "
        f"{ort.__version__} here, so rows past the window would attend to the wrong keys; quantize the fp32 "
        f"bundle again with this onnxruntime (or with --attention ops)"
    )
