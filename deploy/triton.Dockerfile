# Triton's container plus specdeploy's runtime on its Python, for the manifests that
# `specdeploy triton BUNDLE -o repo --copy --manifests k8s/` writes (image specdeploy-triton:24.10).
# Triton 24.10 is tritonserver 2.51, the version the tests run; its Python stub needs numpy<2.
FROM nvcr.io/nvidia/tritonserver:24.10-py3
RUN python3 -m pip install --no-cache-dir "numpy<2" onnxruntime tokenizers jinja2 \
 && python3 -m pip install --no-cache-dir --no-deps specdeploy
