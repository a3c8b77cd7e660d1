"""A terminal chat: each line you type is a user turn; replies stream as they are decoded.

    python examples/chat_loop.py engine.plan        (Ctrl-D or 'exit' to quit)
"""
import sys

from specdeploy import Engine, GenerationConfig, SpecDeployError


def main(bundle: str) -> None:
    history = []
    config = GenerationConfig(max_new_tokens=128, temperature=0.7, top_p=0.9)
    with Engine(bundle) as engine:
        while True:
            try:
                line = input("you> ").strip()
            except EOFError:
                break
            if line in ("exit", "quit"):
                break
            if not line:
                continue
            history.append({"role": "user", "content": line})
            print("bot> ", end="", flush=True)
            try:
                reply = "".join(print(p.text, end="", flush=True) or p.text for p in engine.stream(history, config))
            except SpecDeployError as exc:  # e.g. the conversation outgrew the context: start over
                print(f"\n[{exc}]")
                history = []
                continue
            print()
            history.append({"role": "assistant", "content": reply})


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "engine.plan")
