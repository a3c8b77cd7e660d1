"""Query `specdeploy serve` with the official openai client, streaming, and read the speculative stats.

    specdeploy serve engine.plan &
    python examples/openai_client.py http://127.0.0.1:8000/v1 "Name three rivers."
"""
import sys

from openai import OpenAI


def main(base_url: str, question: str) -> None:
    client = OpenAI(base_url=base_url, api_key="not-needed")
    stream = client.chat.completions.create(
        model="specdeploy", messages=[{"role": "user", "content": question}], max_tokens=64,
        temperature=0, stream=True,
    )
    final = None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            print(chunk.choices[0].delta.content, end="", flush=True)
        final = chunk
    print()
    spec = (final.model_extra or {}).get("speculative", {})
    print(f"acceptance {spec.get('acceptance_rate', 0):.0%}, {spec.get('tokens_per_round', 0):.2f} tokens/round, "
          f"{spec.get('tokens_per_second', 0):.1f} tok/s, drafted by {spec.get('draft_source')}")
    # per request: turn speculation off, or pick the draft source
    plain = client.completions.create(model="specdeploy", prompt=question, max_tokens=16, temperature=0,
                                      extra_body={"speculative": False})
    print("plain:", plain.choices[0].text.strip()[:60], "| source:", plain.model_extra["speculative"]["draft_source"])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000/v1",
         sys.argv[2] if len(sys.argv) > 2 else "Name three rivers.")
