#!/bin/bash
B=q15-q4km-ours.plan
for side in old new old new; do
  if [ $side = old ]; then P=OLD_CHECKOUT (the commit before); else P=THIS_CHECKOUT; fi
  (cd $P && PYTHONPATH=$P THIS_CHECKOUT/.venv/bin/python -c "from specdeploy.cli import main; main()" bench $B --quick --greedy-only --no-plots -o OUT/$side-$RANDOM > /dev/null 2>&1)
done
cd THIS_CHECKOUT && .venv-peers/bin/specdeploy bench $B --compare --peers llama.cpp --model models/qwen2.5-1.5b-random-q4_k_m.gguf --repeats 2 --prompts-per-category 1 --no-plots -o OUT/compare > OUT/compare.log 2>&1
echo done > OUT/DONE
