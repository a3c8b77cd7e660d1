"""Built-in calibration prompts: task kinds x topics, held out by whole task kind.

Holding out whole task kinds (not single prompts) keeps the held-out acceptance honest: prompts
of a kind share phrasing the adapter would otherwise memorise.
"""
from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from ..jsonl import read_objects

TASKS = {
    "explain": "Explain {t} to a curious teenager in a short paragraph.",
    "list": "List five interesting facts about {t}.",
    "story": "Write a short story that involves {t}.",
    "email": "Write a polite email to a colleague about {t}.",
    "pros_cons": "What are the pros and cons of {t}?",
    "summary": "Summarise what most people should know about {t} in three sentences.",
    "code": "Write a Python function related to {t}, with a docstring and a short example.",
    "question": "What is the most common misconception about {t}, and what is the truth?",
    "history": "Give a brief history of {t}.",
    "advice": "Give practical advice to a beginner interested in {t}.",
    "poem": "Write a short poem about {t}.",
    "compare": "Compare {t} with something similar and explain the differences.",
}
HELD_OUT_TASKS = ("advice", "poem", "compare")
TOPICS = [
    "photosynthesis", "black holes", "the stock market", "bread baking", "electric cars",
    "the French Revolution", "machine learning", "coral reefs", "chess openings", "volcanoes",
    "sleep", "the internet", "honeybees", "solar panels", "the Roman Empire", "vaccines",
    "climate change", "sorting algorithms", "coffee", "the human heart",
]


def builtin(held_out: bool) -> list[list[dict]]:
    """Chat conversations of the training (held_out=False) or held-out task kinds."""
    tasks = [t for t in TASKS if (t in HELD_OUT_TASKS) == held_out]
    return [[{"role": "user", "content": TASKS[task].format(t=topic)}]
            for task in tasks for topic in TOPICS]


def load_user_prompts(path: Path) -> list[list[dict]]:
    """JSONL: one object per line, either {"prompt": str} or {"messages": [{role, content}, ...]}."""
    conversations = []
    for number, item in read_objects(path, '{"prompt": "..."}'):
        if isinstance(item, dict) and isinstance(item.get("prompt"), str):
            conversations.append([{"role": "user", "content": item["prompt"]}])
        elif isinstance(item, dict) and isinstance(item.get("messages"), list):
            conversations.append(item["messages"])
        else:
            raise ConfigError(f"{path}:{number} needs a 'prompt' string or a 'messages' list")
    return conversations
