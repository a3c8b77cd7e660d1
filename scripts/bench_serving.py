"""The serving layer's cost, measured: in-process runtime vs `specdeploy serve` vs Triton, one bundle.

    python scripts/bench_serving.py BUNDLE [--max-tokens 64] [--repeats 3]

One stream: the same greedy prompts (one per bench category, chat-templated) through each path,
interleaved prompt by prompt and repeated (median), outputs checked identical. Then aggregate
tokens/s of 8 concurrent clients through Triton with 1 instance (all cores) and 2 instances (one
core each), and through `specdeploy serve` (one sequence at a time). Needs scripts/setup_triton.sh.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from specdeploy import Engine, GenerationConfig
from specdeploy.prompts import bench_prompts

ROOT = Path(__file__).resolve().parents[1]
CORES = os.cpu_count() or 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc, timeout=180) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"server at {url} did not become ready")


def start_serve(bundle: Path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "specdeploy.cli", "serve", str(bundle), "--port", str(port),
                             "--max-queue", "16"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_ready(f"http://127.0.0.1:{port}/health", proc)
    return proc, f"http://127.0.0.1:{port}"


def start_triton(bundle: Path, tmp: Path, instances: int, threads: int):
    repo = tmp / f"repo-{instances}"
    subprocess.run([sys.executable, "-m", "specdeploy.cli", "triton", str(bundle), "-o", str(repo),
                    "--instances", str(instances), "--threads", str(threads), "--max-queue", "16"],
                   check=True, stdout=subprocess.DEVNULL)
    port = free_port()
    proc = subprocess.Popen([str(ROOT / "scripts" / "tritonserver.sh"), str(repo), "--http-port", str(port),
                             "--grpc-port", str(free_port()), "--metrics-port", str(free_port())],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_ready(f"http://127.0.0.1:{port}/v2/health/ready", proc)
    return proc, f"http://127.0.0.1:{port}/v2/models/specdeploy"


def via_serve(url: str, messages, max_tokens: int) -> tuple[str, int]:
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    text, tokens = [], 0
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                text.append(chunk["choices"][0]["delta"].get("content") or "")
                tokens = chunk.get("usage", {}).get("completion_tokens", tokens)
    return "".join(text), tokens


def via_triton(url: str, messages, max_tokens: int) -> tuple[str, int]:
    body = {"messages": json.dumps(messages), "max_tokens": max_tokens, "temperature": 0, "stream": True}
    text, tokens = [], 0
    with httpx.stream("POST", url + "/generate_stream", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                event = json.loads(line[6:])
                text.append(event["text_output"])
                tokens = event.get("completion_tokens", tokens)
    return "".join(text), tokens


def one_stream(engine, serve_url, triton_url, prompts, max_tokens, repeats) -> dict:
    def in_process(messages, n):
        result = engine.generate(messages, GenerationConfig(max_new_tokens=n))
        return result.text, result.stats.generated_tokens

    paths = {"in-process": in_process, "specdeploy serve": lambda m, n: via_serve(serve_url, m, n),
             "triton": lambda m, n: via_triton(triton_url, m, n)}
    seconds = {name: [] for name in paths}
    outputs, tokens = {name: [] for name in paths}, {name: 0 for name in paths}
    for repeat in range(repeats):
        elapsed = dict.fromkeys(paths, 0.0)
        for messages in prompts:
            for name, run in paths.items():
                began = time.perf_counter()
                text, n = run(messages, max_tokens)
                elapsed[name] += time.perf_counter() - began
                if repeat == 0:
                    outputs[name].append(text)
                    tokens[name] += n
        for name in paths:
            seconds[name].append(elapsed[name])
    rates = {name: tokens[name] / statistics.median(seconds[name]) for name in paths}
    return {"tokens_per_second": {k: round(v, 2) for k, v in rates.items()},
            "vs_in_process": {k: round(v / rates["in-process"], 3) for k, v in rates.items()},
            "outputs_identical": all(outputs[n] == outputs["in-process"] for n in paths)}


def concurrent(run, prompts, max_tokens, clients=8) -> float:
    jobs = [prompts[i % len(prompts)] for i in range(clients)]
    began = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(lambda m: run(m, max_tokens), jobs))
    return round(sum(n for _, n in results) / (time.perf_counter() - began), 2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    prompts = [[{"role": "user", "content": ps[0]}] for ps in bench_prompts().values()]
    procs = []
    try:
        with tempfile.TemporaryDirectory() as tmp, Engine(args.bundle) as engine:
            serve, serve_url = start_serve(args.bundle)
            procs.append(serve)
            triton, triton_url = start_triton(args.bundle, Path(tmp), 1, CORES)
            procs.append(triton)
            report = {"machine": f"{CORES} cores", "max_tokens": args.max_tokens, "prompts": len(prompts),
                      "one_stream": one_stream(engine, serve_url, triton_url, prompts, args.max_tokens, args.repeats)}
            report["eight_clients_tokens_per_second"] = {
                "specdeploy serve (one sequence at a time)": concurrent(lambda m, n: via_serve(serve_url, m, n),
                                                                        prompts, args.max_tokens),
                f"triton, 1 instance x {CORES} threads": concurrent(lambda m, n: via_triton(triton_url, m, n),
                                                                    prompts, args.max_tokens)}
            triton.terminate()
            triton.wait(60)
            two, two_url = start_triton(args.bundle, Path(tmp), 2, max(1, CORES // 2))
            procs.append(two)
            report["eight_clients_tokens_per_second"][f"triton, 2 instances x {max(1, CORES // 2)} threads"] = \
                concurrent(lambda m, n: via_triton(two_url, m, n), prompts, args.max_tokens)
    finally:
        for proc in procs:
            proc.terminate()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
