"""Embed the runtime: load a bundle once, stream a completion, print its statistics.

    python examples/stream_generate.py engine.plan "Why is the sky blue?"
"""
import sys

from specdeploy import Engine, GenerationConfig, GenerationStats


def main(bundle: str, prompt: str) -> None:
    config = GenerationConfig(max_new_tokens=96, temperature=0.0)
    with Engine(bundle) as engine:  # ONNX Runtime on the CPU; a GPU needs a bundle made for it (docs/gpus.md)
        stats = GenerationStats()
        for piece in engine.stream([{"role": "user", "content": prompt}], config, stats=stats):
            print(piece.text, end="", flush=True)
        print()
        s = stats
        print(f"{s.generated_tokens} tokens, {s.tokens_per_second:.1f} tok/s, acceptance {s.acceptance_rate:.0%}, "
              f"{s.tokens_per_round:.2f} tokens/round, finish: {s.finish_reason}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "engine.plan",
         sys.argv[2] if len(sys.argv) > 2 else "Write a haiku about the sea.")
