"""Time to first token over a six-turn chat through `specdeploy serve`, with and without prefix reuse.

    python scripts/chat_turns.py BUNDLE [--turns 6] [--max-tokens 128] [--engine]

Two servers on the same bundle, one with prefix reuse (the default) and one started with
--no-prefix-reuse, take the same conversation turn by turn, interleaved: each turn's request (the
whole history, as an OpenAI client sends it) goes to one and then the other, streamed, greedy. It
prints each turn's history length and time to first token on both, the ratio of the last turn's to
the first's, and whether the replies are identical (they must be: reuse is bitwise a fresh prefill).

--engine: the same chat in process through a `Conversation` (what examples/chat_loop.py uses), which
keeps the history as decoded tokens, on an Engine with prefix reuse and one without.
"""
from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time

import httpx

USER_TURNS = [
    "I am building a small weather station for my garden with a microcontroller, a temperature and humidity "
    "sensor, a rain gauge and a solar panel that charges a battery. It should send a reading every ten minutes "
    "over Wi-Fi to a computer in the house. What parts of the design should I think about first, and why?",
    "The station will sit on a wooden post about two metres high, in full sun for most of the day. In summer "
    "the air reaches thirty-five degrees, and in winter it can fall to ten below. How should I protect the "
    "electronics and keep the temperature readings honest when the sun shines on the enclosure?",
    "For power I have a six-volt panel of two watts and an 18650 lithium cell of 3,000 milliamp-hours. The "
    "microcontroller draws about eighty milliamps while Wi-Fi is on and ten microamps in deep sleep. Each "
    "reading keeps Wi-Fi on for about four seconds. Will the battery last through a week of cloudy weather?",
    "The rain gauge is a tipping bucket that closes a reed switch once for every 0.2 millimetres of rain. "
    "I want to count tips while the microcontroller sleeps, without missing any during a heavy storm. How "
    "should I wire the switch and write the code so that the count survives deep sleep and bouncing contacts?",
    "On the computer in the house I would like to keep a year of readings and draw charts of temperature, "
    "humidity and rainfall by day and by month. I know a little Python. Which simple way of storing the "
    "readings and drawing the charts would you suggest, and what would the table of readings look like?",
    "Finally, I sometimes lose Wi-Fi for an hour or two when the router restarts at night. I do not want "
    "gaps in the data. How can the station keep readings it could not send and send them later, and what "
    "should I test before I leave it outside for the winter? Please give me a short checklist.",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(bundle: str, *flags: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "specdeploy.cli", "serve", bundle, "--port", str(port), *flags],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    raise SystemExit(f"Error: the server on {bundle} did not start")


def turn(url: str, messages: list[dict], max_tokens: int) -> tuple[float, str, dict]:
    """(seconds to the first content, the reply, the usage) of one streamed greedy request."""
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "repetition_penalty": 1.0, "top_p": 1.0, "top_k": 0}
    began, first, text, usage = time.perf_counter(), None, [], {}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            content = chunk["choices"][0]["delta"].get("content") if chunk.get("choices") else None
            if content and first is None:
                first = time.perf_counter() - began
            text.append(content or "")
            usage = chunk.get("usage") or usage
    return first or float("nan"), "".join(text), usage


def engine_turns(bundle: str, turns: int, max_tokens: int) -> list[dict]:
    """The chat in process: a Conversation on an Engine with prefix reuse and on one without."""
    from specdeploy import Conversation, Engine, GenerationConfig, GenerationStats

    config = GenerationConfig(max_new_tokens=max_tokens, temperature=0, repetition_penalty=1.0)
    engines = {"reuse": Engine(bundle), "fresh": Engine(bundle, prefix_reuse=False)}
    chats = {name: Conversation(engine) for name, engine in engines.items()}
    for engine in engines.values():  # first calls set up sessions and caches: not a turn's cost
        engine.generate("Hello", GenerationConfig(max_new_tokens=8, temperature=0))
    rows = []
    try:
        for i, user in enumerate(USER_TURNS[:turns]):
            row = {"turn": i + 1}
            for name, chat in chats.items():
                stats, began, first = GenerationStats(), time.perf_counter(), None
                texts = []
                for piece in chat.stream(user, config, stats):
                    first = first if first is not None else time.perf_counter() - began
                    texts.append(piece.text)
                row[name] = {"ttft_ms": round(1000 * first, 1), "prompt_tokens": stats.prompt_tokens,
                             "cached_tokens": stats.cached_tokens, "reply": "".join(texts)}
            rows.append(row)
            report(row)
    finally:
        for engine in engines.values():
            engine.close()
    return rows


def server_turns(bundle: str, turns: int, max_tokens: int) -> list[dict]:
    servers = {"reuse": start(bundle), "fresh": start(bundle, "--no-prefix-reuse")}
    for _, url in servers.values():  # first calls set up sessions and caches: not a turn's cost
        turn(url, [{"role": "user", "content": "Hello"}], 8)
    histories = {name: [] for name in servers}
    rows = []
    try:
        for i, user in enumerate(USER_TURNS[:turns]):
            row = {"turn": i + 1}
            for name, (_, url) in servers.items():
                histories[name].append({"role": "user", "content": user})
                ttft, reply, usage = turn(url, histories[name], max_tokens)
                histories[name].append({"role": "assistant", "content": reply})
                row[name] = {"ttft_ms": round(1000 * ttft, 1), "prompt_tokens": usage.get("prompt_tokens"),
                             "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
                             "reply": reply}
            rows.append(row)
            report(row)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(30)
    return rows


def report(row: dict) -> None:
    r, f = row["reuse"], row["fresh"]
    print(f"turn {row['turn']}: {r['prompt_tokens']} prompt tokens ({r['cached_tokens']} reused): "
          f"first token {r['ttft_ms']} ms with reuse, {f['ttft_ms']} ms without; "
          f"replies {'identical' if r['reply'] == f['reply'] else 'DIFFER'}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--engine", action="store_true", help="In process, through a Conversation.")
    args = parser.parse_args()
    rows = (engine_turns if args.engine else server_turns)(args.bundle, args.turns, args.max_tokens)
    for name in ("reuse", "fresh"):
        print(f"{name}: last turn's first token / first turn's = "
              f"{rows[-1][name]['ttft_ms'] / rows[0][name]['ttft_ms']:.2f}x")
    same = all(r["reuse"]["reply"] == r["fresh"]["reply"] for r in rows)
    print(f"replies identical with and without reuse: {same}")
    print(json.dumps([{k: ({kk: vv for kk, vv in v.items() if kk != 'reply'} if isinstance(v, dict) else v)
                       for k, v in r.items()} for r in rows]))
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
