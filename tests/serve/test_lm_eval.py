"""lm-evaluation-harness's `local-completions` runs a local loglikelihood task end to end against
`specdeploy serve`, offline, with the server's own tokenizer endpoints; its scores are the
bundle's own log-probabilities of each continuation."""
import json
import os
import subprocess
from pathlib import Path

import pytest

from specdeploy.runtime.engine import Engine
from tests_serve_support import RunningServer

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
LM_EVAL = ROOT / ".venv-eval" / "bin" / "lm_eval"
DOCS = [{"question": "w5 w6 w7", "choices": ["w8", "w9 w10", "w11"], "answer": 1},
        {"question": "w20 w21", "choices": ["w22 w23", "w24", "w25"], "answer": 0},
        {"question": "w40 w41 w42 w43", "choices": ["w44", "w45", "w46 w47"], "answer": 2}]
TASK = """task: specdeploy_local
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
target_delimiter: " "
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    if not LM_EVAL.is_file():
        pytest.skip("lm-evaluation-harness is not installed: run scripts/setup_eval.sh (scripts/test.sh does)")
    root = tmp_path_factory.mktemp("lm-eval")
    data = root / "data.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    (root / "specdeploy_local.yaml").write_text(TASK.format(data=data))
    return root


def loglikelihood(engine, context: str, continuation: str) -> float:
    """The continuation's log-probability given the context, from the bundle's own prompt logprobs."""
    ctx = engine.tokenizer.encode(context)
    whole = engine.tokenizer.encode(context + continuation)
    scored = engine.prompt_logprobs(whole)
    return sum(e.logprob for e in scored[len(ctx):])


def test_lm_eval_scores_a_local_task_with_the_bundles_own_logprobs(tiny_bundle, task_dir, tmp_path):
    server = RunningServer(tiny_bundle)
    try:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
        args = [str(LM_EVAL), "--model", "local-completions", "--model_args",
                f"base_url={server.url}/v1/completions,model=tiny,tokenizer_backend=remote",
                "--tasks", "specdeploy_local", "--include_path", str(task_dir),
                "--output_path", str(tmp_path / "out"), "--log_samples"]
        run = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    finally:
        server.stop()
    samples = [json.loads(line) for f in (tmp_path / "out").rglob("samples_specdeploy_local_*.jsonl")
               for line in f.read_text().splitlines()]
    assert len(samples) == len(DOCS)
    with Engine(tiny_bundle) as engine:
        for sample in samples:
            doc = sample["doc"]
            for choice, resp in zip(doc["choices"], sample["resps"]):
                expected = loglikelihood(engine, doc["question"], " " + choice)
                assert float(resp[0][0]) == pytest.approx(expected, abs=1e-4)  # logged as text
