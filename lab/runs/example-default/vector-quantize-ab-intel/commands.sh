#!/bin/bash
B=/tmp/runs15/engine.plan
for side in old new old new; do
  if [ $side = old ]; then P=OLD_CHECKOUT (the commit before); else P=THIS_CHECKOUT; fi
  (cd $P && PYTHONPATH=$P THIS_CHECKOUT/.venv/bin/python -c "from specdeploy.cli import main; main()" bench $B --quick --greedy-only --no-plots -o OUT/$side-$RANDOM > OUT/$side-$(date +%s).log 2>&1)
done
echo done > OUT/DONE
