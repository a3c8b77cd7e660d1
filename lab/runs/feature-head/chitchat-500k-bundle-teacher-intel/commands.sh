# the example's head from MIT-licensed small talk, the int4 bundle as teacher (2026-12-06, Intel VM, 2 cores)
python scripts/fetch_conversations.py -o data/conversations
specdeploy export --exit-layer 8 --features models/SmolLM2-135M-Instruct.Q4_1.gguf -o features.plan
/usr/bin/time -v specdeploy train-head models/SmolLM2-135M-Instruct.Q4_1.gguf --bundle features.plan \
    --data data/conversations/chitchat.jsonl -o heads/chitchat-500k --tokens 500000 --steps 1000 \
    --draft-vocab 4096 --intermediate-size 768 --held-out 32
specdeploy export --exit-layer 8 --feature-head heads/chitchat-500k models/SmolLM2-135M-Instruct.Q4_1.gguf -o fh.plan
specdeploy bench fh.plan --quick --greedy-only --no-plots        # then engine.plan the same way, right after
