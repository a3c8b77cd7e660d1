#!/bin/bash
# the example as the README's commands make it, beside llama.cpp and ORT GenAI, one run
while [ ! -f /tmp/runs15/DONE ]; do sleep 10; done
cd /tmp/measure
export PYTHONPATH=/tmp/measure
M=models/SmolLM2-135M-Instruct.Q4_1.gguf
rm -rf /tmp/runs15/engine.plan
/usr/bin/time -v /work/main/.venv/bin/specdeploy export --exit-layer 8 $M -o /tmp/runs15/engine.plan > /tmp/runs15/example-export.txt 2>&1
.venv-peers/bin/specdeploy bench /tmp/runs15/engine.plan --compare --peers llama.cpp,ortgenai-int4 \
   --model $M --repeats 3 --prompts-per-category 1 --no-plots -o /tmp/runs15/example-compare > /tmp/runs15/example-compare.log 2>&1
/work/main/.venv/bin/specdeploy bench /tmp/runs15/engine.plan --quick --greedy-only -o /tmp/runs15/example-quick > /tmp/runs15/example-quick.log 2>&1
echo done > /tmp/runs15/EXAMPLE_DONE
# 2026-12-06: peers.md / peers.json run again on the same bundle with the current runtime (the LM head's
# sixteen-column form and vector activation quantization), from this checkout:
#   .venv-peers/bin/specdeploy bench engine.plan --compare --peers llama.cpp,ortgenai-int4 \
#      --model models/SmolLM2-135M-Instruct.Q4_1.gguf --repeats 3 --prompts-per-category 1 --no-plots
# quick.md: the last run of vector-quantize-ab-intel/ (4-new.md)
