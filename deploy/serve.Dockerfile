# `specdeploy serve` in a container: the runtime and the server only (no torch), a bundle mounted read-only.
#
#   docker build -f deploy/serve.Dockerfile -t specdeploy-serve .
#   docker run -p 8000:8000 -v "$PWD/engine.plan:/models/engine.plan:ro" specdeploy-serve
#
# On an NVIDIA GPU (ONNX Runtime's CUDA provider; a bundle exported with --target cuda):
#
#   docker build -f deploy/serve.Dockerfile -t specdeploy-serve:cuda \
#     --build-arg BASE=nvidia/cuda:13.0.0-cudnn-runtime-ubuntu24.04 --build-arg ONNXRUNTIME=onnxruntime-gpu==1.31.1 .
#   docker run --gpus all -p 8000:8000 -v "$PWD/cuda.plan:/models/engine.plan:ro" specdeploy-serve:cuda --provider cuda
#
# Arguments after the image name go to `specdeploy serve` (--api-key, --max-queue, ...); the API key
# can come from the environment instead (-e SPECDEPLOY_API_KEY=...). TLS is the reverse proxy's job.
# On Jetson, JetPack's L4T base (nvcr.io/nvidia/l4t-jetpack:r36.4.0) with the onnxruntime-gpu wheel
# for JetPack 6 and Python 3.10 (docs/gpus.md), and a bundle exported with --target jetson-orin.
ARG BASE=python:3.11-slim
FROM ${BASE}
ARG ONNXRUNTIME=onnxruntime
RUN command -v python3 >/dev/null && python3 -m venv --help >/dev/null 2>&1 \
 || (apt-get update && apt-get install -y --no-install-recommends python3 python3-venv \
     && rm -rf /var/lib/apt/lists/*)
RUN python3 -m venv /opt/specdeploy
ENV PATH=/opt/specdeploy/bin:$PATH PYTHONDONTWRITEBYTECODE=1
# one ONNX Runtime only (never onnxruntime and onnxruntime-gpu together), then the rest of the
# runtime's and the server's dependencies (pyproject.toml: dependencies and the serve extra)
RUN pip install --no-cache-dir "$ONNXRUNTIME" "numpy>=1.24" "tokenizers>=0.20" "jinja2>=3.1" "click>=8.1" \
    "starlette>=0.40" "uvicorn>=0.30" "llguidance>=1.0"
COPY pyproject.toml README.md /src/
COPY specdeploy /src/specdeploy
RUN pip install --no-cache-dir --no-deps /src && rm -rf /src
RUN useradd --system --uid 10001 specdeploy
USER specdeploy
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s \
  CMD python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4)"
ENTRYPOINT ["specdeploy", "serve", "/models/engine.plan", "--host", "0.0.0.0", "--port", "8000"]
