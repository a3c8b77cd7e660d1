"""What one `quantize` is asked, as one validated object carried through every step."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..bundle import io_names
from ..config import check_method, check_precision
from ..constants import DEFAULT_QUANT_METHOD, DEFAULT_TARGET
from ..errors import ConfigError
from .compute import ComputeOptions


@dataclass(frozen=True)
class QuantizeOptions:
    """`precision` for every graph unless `draft_precision` / `verify_precision` say otherwise (the
    draft head follows the draft graph, the LM head follows verify); `method` rounds int4 / int8
    weights a source GGUF does not carry (gptq by default: the lowest error of the methods offered);
    `tensorrt` also writes each integer graph's DequantizeLinear form; `report` measures the quality
    report against the fp32 bundle; `compute` says how integer graphs are built."""

    precision: str
    draft_precision: str | None = None
    verify_precision: str | None = None
    method: str = DEFAULT_QUANT_METHOD
    tensorrt: bool = False
    prompts_file: Path | None = None
    report: bool = True
    compute: ComputeOptions = ComputeOptions()
    target: str = DEFAULT_TARGET  # recorded in the manifest; its graph forms are `compute`'s and `tensorrt`

    def __post_init__(self):
        for p in (self.precision, self.draft_precision, self.verify_precision):
            if p is not None:
                check_precision(p)
        check_method(self.method)
        if self.tensorrt and self.compute.int4_kernel == "specdeploy":
            raise ConfigError("--int4-kernel specdeploy is specdeploy's CPU operators, which TensorRT cannot "
                              "build; drop it for a TensorRT bundle (or drop --tensorrt)")

    def plan(self, manifest) -> dict[str, str]:
        """Precision per graph of `manifest`."""
        draft, verify = self.draft_precision or self.precision, self.verify_precision or self.precision
        by_graph = {io_names.DRAFT: draft, io_names.DRAFT_HEAD: draft, io_names.VERIFY: verify, io_names.HEAD: verify}
        feature = "fp16" if draft == "fp8" else draft  # a drafter: fp8's calibrator has no feeds for it
        by_graph.update({name: feature for name in io_names.FEATURE_GRAPHS})
        return {name: by_graph[name] for name in manifest.graphs}

    def label(self, plan: dict[str, str]) -> str:
        """The bundle's precision: one name, or each graph's where they differ."""
        return self.precision if len(set(plan.values())) == 1 else "+".join(f"{k}:{v}" for k, v in plan.items())

    def texts(self) -> list[str]:
        """Calibration text: the built-in prompts (every one for GPTQ's Gram matrices) and the user's."""
        from .feeds import calibration_texts

        return calibration_texts(self.prompts_file, every=self.method == "gptq")


def for_target(options: QuantizeOptions, target: str, attention: str | None = None) -> QuantizeOptions:
    """`options` with the graph forms `target` asks for (config.TARGET_FORMS); `attention` ("fused" or
    "ops") where the caller chose one, which a GPU target refuses if fused."""
    import dataclasses

    from ..config import target_form

    form = target_form(target, options.compute.int4_kernel, None,
                       (options.precision, options.draft_precision, options.verify_precision))
    if attention == "fused" and not form.fused_attention:
        raise ConfigError(f"--attention fused is ONNX Runtime's CPU GroupQueryAttention, which --target {target} "
                          f"cannot run in float32; drop --attention")
    fused = form.fused_attention if attention is None else attention == "fused"
    compute = dataclasses.replace(options.compute, int4_kernel=form.int4_kernel or options.compute.int4_kernel,
                                  fused_attention=fused)
    return dataclasses.replace(options, compute=compute, tensorrt=options.tensorrt or form.tensorrt_form, target=target)
