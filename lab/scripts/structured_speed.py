"""Structured output's speed: JSON-schema-constrained decoding, default (speculative) against plain, interleaved.

Usage: .venv/bin/python lab/scripts/structured_speed.py BUNDLE [--repeats 3] [--max-tokens 160]

Three schemas (nested objects, enums, arrays, bounded numbers) and a free-text reply for reference,
each greedy, plain and default, alternated and repeated (median tokens/s). Prints each case's
ratio, whether greedy speculative output equals plain, and whether every output validates.
"""
from __future__ import annotations

import argparse
import json
import statistics

from specdeploy import Engine, GenerationConfig, GenerationStats, ResponseFormat

SCHEMAS = {
    "forecast": {"type": "object", "required": ["city", "days"], "properties": {
        "city": {"type": "string"}, "days": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
            "type": "object", "required": ["day", "sky", "high_c"], "properties": {
                "day": {"enum": ["mon", "tue", "wed"]}, "sky": {"enum": ["sun", "cloud", "rain"]},
                "high_c": {"type": "number", "minimum": -30, "maximum": 50}}}}}},
    "person": {"type": "object", "required": ["name", "age", "address"], "properties": {
        "name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "address": {"type": "object", "required": ["street", "city"], "properties": {
            "street": {"type": "string"}, "city": {"type": "string"}}}}},
    "command": {"type": "object", "required": ["action", "device", "level"], "properties": {
        "action": {"enum": ["on", "off", "dim"]}, "device": {"enum": ["lamp", "fan", "heater"]},
        "level": {"type": "integer", "minimum": 0, "maximum": 100}}},
}
PROMPTS = {"forecast": "Give a three-day weather forecast for Oslo as JSON.",
           "person": "Describe a fictional person as JSON.",
           "command": "Turn the lamp down to thirty percent. Answer with the command as JSON.",
           "free text": "Describe a fictional person."}


def run(engine, messages, fmt, speculative: bool, max_tokens: int):
    stats = GenerationStats()
    config = GenerationConfig(max_new_tokens=max_tokens, temperature=0, repetition_penalty=1.0,
                              speculative=speculative, response_format=fmt)
    ids = engine.encode_prompt(messages)
    tokens = engine.generate_ids(ids, config, stats)
    return tokens, stats.generated_tokens / stats.decode_s if stats.decode_s else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=160)
    args = parser.parse_args()
    with Engine(args.bundle) as engine:
        for name, prompt in PROMPTS.items():
            fmt = ResponseFormat("json_schema", schema=SCHEMAS[name]) if name in SCHEMAS else None
            messages = [{"role": "user", "content": prompt}]
            rates = {True: [], False: []}
            outputs = {}
            for _ in range(args.repeats):
                for speculative in (False, True):
                    outputs[speculative], rate = run(engine, messages, fmt, speculative, args.max_tokens)
                    rates[speculative].append(rate)
            plain, spec = statistics.median(rates[False]), statistics.median(rates[True])
            valid = "" if fmt is None else f", parses: {_parses(engine, outputs[True])}"
            print(f"{name}: plain {plain:.1f} tok/s, default {spec:.1f} tok/s ({spec / plain:.2f}x), "
                  f"{len(outputs[True])} tokens, greedy identical: {outputs[True] == outputs[False]}{valid}", flush=True)


def _parses(engine, tokens) -> bool:
    try:
        json.loads(engine.tokenizer.decode(tokens))
        return True
    except json.JSONDecodeError:
        return False


if __name__ == "__main__":
    main()
