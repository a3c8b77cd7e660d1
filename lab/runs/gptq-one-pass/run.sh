# snap3: this change (one fp32 pass per graph) -> q-one-pass-N.txt; snapold: c90d477, the commit before it -> q-before-N.txt
set -e
PY=/work/main/.venv/bin/python
cd /tmp/snap3
$PY -m specdeploy.cli export --exit-layer 8 --precision fp32 /work/main/models/SmolLM2-135M-Instruct.Q4_1.gguf -o /tmp/ex/engine.plan > /tmp/ex/export.txt 2>&1
cp -a /tmp/ex/engine.plan /tmp/ex/nosrc.plan
$PY - <<'PY'
import json, pathlib
p = pathlib.Path("/tmp/ex/nosrc.plan/manifest.json"); m = json.loads(p.read_text())
m["extra"].pop("source"); p.write_text(json.dumps(m, indent=2))
PY
for i in 1 2; do
  for v in snapold snap3; do
    cd /tmp/$v
    /usr/bin/time -f "%e s %M KB" $PY -m specdeploy.cli quantize /tmp/ex/nosrc.plan --precision int4 -o /tmp/ex/q-$v-$i.plan > /tmp/ex/q-$v-$i.txt 2>&1
  done
done
