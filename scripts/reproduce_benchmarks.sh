#!/usr/bin/env bash
# Re-measure the example model's figures (docs/results.md, lab/notes/benchmarks-history.md) on this
# machine, about 75 minutes on 2 cores. Raw runs go to $OUT (default bench-runs/, never lab/runs:
# the kept runs there are the record the docs cite; copy a run there by hand when a page quotes it).
# engine.plan here is the fp32 bundle every quantized one is made from.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/specdeploy ] || scripts/setup.sh
scripts/fetch_model.sh
. .venv/bin/activate
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
OUT=${OUT:-bench-runs}
[ -f engine.plan/manifest.json ] || specdeploy export --exit-layer 8 --precision fp32 "$model" --output engine.plan
[ -f cal.plan/manifest.json ] || time specdeploy calibrate "$model" --output cal.plan
specdeploy bench cal.plan --prompts-per-category 4 --repeats 3 --max-tokens 64 --sweep \
    --model "$model" -o "$OUT"
specdeploy bench cal.plan --prompts-per-category 4 --repeats 3 --max-tokens 64 --greedy-only --no-plots \
    --lookup-ngram 2 4 -o "$OUT/lookup-ngram-2-4"                        # classic prompt lookup and its bound
python lab/scripts/lookup_ngram_ab.py cal.plan                                 # lookup n = 2..4 vs 1..4, one run
specdeploy bench engine.plan --quick -o "$OUT/uncalibrated-quick"
# integer compute beside ONNX Runtime GenAI, llama.cpp, Optimum and HF (scripts/setup_peers.sh: ~15 min once)
scripts/setup_peers.sh
for p in int8 int4; do
    [ -f "engine-$p.plan/manifest.json" ] || specdeploy quantize engine.plan --precision "$p" -o "engine-$p.plan"
done
# int4 re-rounded onto symmetric blocks (what ONNX Runtime GenAI's int4 does) beside the carried default,
# and the carried form with its Q4_1 minima exact (an offset term) instead of folded into the matmuls
[ -f int4-ort.plan/manifest.json ] || specdeploy quantize engine.plan --precision int4 --method ort -o int4-ort.plan
[ -f engine-int4-exact.plan/manifest.json ] || specdeploy quantize engine.plan --precision int4 --exact-offsets \
    -o engine-int4-exact.plan
.venv-peers/bin/specdeploy bench engine.plan --compare --also engine-int8.plan --also engine-int4.plan \
    --also int4-ort.plan --model "$model" --repeats 3 --prompts-per-category 1 -o "$OUT/peers"
for i in 1 2 3; do   # the exact int4 against llama.cpp, three runs in a row
    .venv-peers/bin/specdeploy bench engine-int4.plan --compare --also int4-ort.plan --peers llama.cpp,ortgenai-int4 \
        --model "$model" --repeats 3 --prompts-per-category 1 --no-plots -o "$OUT/int4-vs-llamacpp/$i"
done
specdeploy bench engine-int4.plan --greedy-only --prompts-per-category 4 --repeats 3 --no-plots -o "$OUT/int4-greedy"
# activation outliers in float (the int8 default) against without, and int4 with them
rm -rf int8-nofloat.plan int4-fo.plan
specdeploy quantize engine.plan --precision int8 --no-float-outliers -o int8-nofloat.plan | grep "top-1"
specdeploy quantize engine.plan --precision int4 --float-outliers -o int4-fo.plan | grep "top-1"
.venv-peers/bin/specdeploy bench engine-int8.plan --compare --also int8-nofloat.plan --also engine-int4.plan \
    --also int4-fo.plan --peers ortgenai-int8,ortgenai-int4,llama.cpp --model "$model" --repeats 3 \
    --prompts-per-category 1 --no-plots -o "$OUT/float-outliers"
python lab/scripts/quality_compare.py engine.plan engine-int8.plan int8-nofloat.plan engine-int4.plan int4-fo.plan
python lab/scripts/outlier_channels.py engine.plan --top 30                    # the channels and their ratios
python lab/scripts/arena_ab.py engine-int4.plan --repeats 6; python lab/scripts/arena_ab.py engine.plan --repeats 2   # one shared arena: as fast, a steadier, lower peak
python lab/scripts/arena_ab.py engine-int4.plan --long-prompt 1900   # a long prompt's peak with and without the arena
python lab/scripts/prefill_ab.py engine-int4.plan --prompt-tokens 1900 --chunks 64,128,256,512; python lab/scripts/prefill_ab.py engine.plan --chunks 128,256 --repeats 2   # chunked prefill: peak and speed
python lab/scripts/copy_length_ab.py engine-int4.plan --prompts-per-category 4 --repeats 3   # priced copies vs copy all
python lab/scripts/copy_length_ab.py engine.plan                                             # the same on fp32
python lab/scripts/round_overhead.py engine-int4.plan --category qa                  # the drafter's choices between passes
python lab/scripts/offset_cost.py engine-int4-exact.plan    # the exact offset term: its bytes, its ops, what folding saves
python lab/scripts/step_profile.py engine-int4.plan         # a plain step's kernel time by op type
for i in 1 2 3; do   # folded (the default) against exact offsets, llama.cpp and ONNX Runtime GenAI, three runs in a row
    .venv-peers/bin/specdeploy bench engine-int4.plan --compare --also engine-int4-exact.plan --also int4-ort.plan \
        --peers llama.cpp,ortgenai-int4 --model "$model" --repeats 3 --prompts-per-category 1 --no-plots \
        -o "$OUT/int4-vs-llamacpp/folded/$i"
done
# one GroupQueryAttention a layer (the default) against the exported op-by-op attention, and the peers
[ -f int4-before-attention.plan/manifest.json ] || specdeploy quantize engine.plan --precision int4 --attention ops \
    -o int4-before-attention.plan
for i in 1 2 3; do
    .venv-peers/bin/specdeploy bench engine-int4.plan --compare --also int4-before-attention.plan --also int4-ort.plan \
        --peers llama.cpp,ortgenai-int4 --model "$model" --repeats 3 --prompts-per-category 1 --no-plots \
        -o "$OUT/int4-vs-llamacpp/attention/$i"
done
python lab/scripts/step_profile.py int4-before-attention.plan   # 1,253 kernels a step against the default's 735
python lab/scripts/quality_compare.py engine.plan engine-int4.plan int4-before-attention.plan engine-int8.plan
sync   # pages just written stay dirty, and a dirty page is not paged out
for b in engine-int4.plan int4-ort.plan engine.plan engine-int8.plan int8-nofloat.plan; do python lab/scripts/memory_breakdown.py "$b"; done
python lab/scripts/memory_breakdown.py engine.plan --keep   # what the heap trim returns
for b in engine-int4.plan engine.plan; do python lab/scripts/memory_breakdown.py "$b" --keep --arena session; done   # none of it (ONNX Runtime's defaults)
# what fusing and blocks of 32 each gave int4 (on the re-rounded form), and the quality of each form
for v in "u16 --int4-block 16 --no-fuse" "f16 --int4-block 16" "u32 --int4-block 32 --no-fuse"; do
    set -- $v; name=$1; shift
    rm -rf "int4-$name.plan"
    specdeploy quantize engine.plan --precision int4 --method ort "$@" -o "int4-$name.plan" | grep "top-1"
done
.venv-peers/bin/specdeploy bench int4-u16.plan --compare --also int4-f16.plan --also int4-u32.plan \
    --also int4-ort.plan --peers hf --model "$model" --repeats 3 --prompts-per-category 1 --no-plots -o "$OUT/fusion-ab"
rm -rf int8-unfused.plan; specdeploy quantize engine.plan --precision int8 --no-fuse -o int8-unfused.plan | grep "top-1"
python lab/scripts/quality_compare.py engine.plan engine-int8.plan int8-unfused.plan engine-int4.plan int4-ort.plan \
    int4-u16.plan
# Gemma 3's Q4_K_M carried into int4 (the re-quantized rows of its table were measured before the
# K-quant carry, which rtn / minmax now only apply to weights that do not map)
scripts/fetch_gemma3.sh
[ -f gemma3.plan/manifest.json ] || specdeploy export --exit-layer 6 models/gemma-3-270m-q4_k_m.gguf -o gemma3.plan
rm -rf gemma3-int4.plan; specdeploy quantize gemma3.plan --precision int4 -o gemma3-int4.plan | grep "top-1"
# every family's attention as one kernel: Gemma 3's sliding, QK-normed layers fused vs op by op
rm -rf gemma3-int4-ops.plan; specdeploy quantize gemma3.plan --precision int4 --attention ops -o gemma3-int4-ops.plan | grep "top-1"
specdeploy bench gemma3-int4.plan --compare --also gemma3-int4-ops.plan --peers , --model models/gemma-3-270m-q4_k_m.gguf \
    --repeats 3 --prompts-per-category 1 --no-plots -o "$OUT/gemma3-attention"
# packed weights on 2 MB pages (the default) vs 4 KB, each side its own process; load-order bias without / with
python lab/scripts/huge_pages_ab.py engine-int4.plan; python lab/scripts/huge_pages_ab.py gemma3-int4.plan
python lab/scripts/huge_pages_ab.py engine-int4.plan --load-order 3 --small-pages; python lab/scripts/huge_pages_ab.py engine-int4.plan --load-order 3
[ -f int4-ops.plan/manifest.json ] || specdeploy quantize engine.plan --precision int4 --attention ops -o int4-ops.plan
for i in 1 2 3; do   # with 2 MB pages: fused, op by op, --method ort, llama.cpp, ONNX Runtime GenAI int4
    .venv-peers/bin/specdeploy bench engine-int4.plan --compare --also int4-ops.plan --also int4-ort.plan \
        --peers llama.cpp,ortgenai-int4 --model "$model" --repeats 3 --prompts-per-category 1 --no-plots \
        -o "$OUT/int4-vs-llamacpp/huge-pages/$i"
done
.venv-peers/bin/specdeploy bench engine-int8.plan --compare --peers ortgenai-int8 --model "$model" --repeats 3 \
    --prompts-per-category 1 --no-plots -o "$OUT/int8-vs-ortgenai/huge-pages"
specdeploy bench engine-int4.plan --greedy-only --prompts-per-category 4 --repeats 3 --no-plots -o "$OUT/int4-greedy/huge-pages"
# the sessions on one shared CPU arena (the default since): memory per mode, the peers five times, int8, per category four times
python -c "from specdeploy.bench import memory; [print(memory.compare(b)) for b in ('engine-int4.plan', 'engine.plan')]"
for i in 1 2 3 4 5; do
    .venv-peers/bin/specdeploy bench engine-int4.plan --compare --also int4-ort.plan --peers llama.cpp,ortgenai-int4 \
        --model "$model" --repeats 3 --prompts-per-category 1 --no-plots -o "$OUT/int4-vs-llamacpp/arena/$i"
done
.venv-peers/bin/specdeploy bench engine-int8.plan --compare --peers ortgenai-int8 --model "$model" --repeats 3 \
    --prompts-per-category 1 --no-plots -o "$OUT/int8-vs-ortgenai/arena"
for i in 1 2 3 4; do   # runs 3 and 4: after the copy-length prior (runtime/copy_length.py)
    specdeploy bench engine-int4.plan --greedy-only --prompts-per-category 4 --repeats 3 --no-plots -o "$OUT/int4-greedy/arena/$i"
done
for p in fp16 fp8; do
    rm -rf "cal-$p.plan"
    specdeploy quantize cal.plan --precision "$p" -o "cal-$p.plan" | grep "top-1 agreement"
    specdeploy bench "cal-$p.plan" --quick --greedy-only --no-plots -o "/tmp/bench-$p"   # fails if greedy identity breaks
done
# Python 3.10 / ONNX Runtime 1.23 (skipped when no python3.10 is installed)
if command -v "${PYTHON310:-python3.10}" >/dev/null 2>&1; then
    [ -f o23.plan/manifest.json ] || specdeploy export --exit-layer 8 --opset 23 --max-context 1024 "$model" -o o23.plan
    scripts/check_py310.sh o23.plan engine.plan
fi
