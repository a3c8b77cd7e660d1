"""A terminal chat: each line you type is a user turn; replies stream as they are decoded.

    python examples/chat_loop.py engine.plan        (Ctrl-D or 'exit' to quit)

A Conversation keeps the chat as the tokens it was decoded as, so each turn reuses the KV rows of
the whole history: the first token waits for your new line only, however long the chat.
Sampling follows the bundle's defaults (the model's own); pass temperature=0 for greedy.
"""
import sys

from specdeploy import Conversation, Engine, GenerationConfig, SpecDeployError


def main(bundle: str) -> None:
    config = GenerationConfig(max_new_tokens=128)
    with Engine(bundle) as engine:
        chat = Conversation(engine)
        while True:
            try:
                line = input("you> ").strip()
            except EOFError:
                break
            if line in ("exit", "quit"):
                break
            if not line:
                continue
            print("bot> ", end="", flush=True)
            try:
                for piece in chat.stream(line, config):
                    print(piece.text, end="", flush=True)
            except SpecDeployError as exc:  # e.g. the conversation outgrew the context: start over
                print(f"\n[{exc}]")
                chat = Conversation(engine)
                continue
            print()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "engine.plan")
