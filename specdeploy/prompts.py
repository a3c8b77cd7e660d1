"""Built-in prompt sets, written for this project: benchmark categories and calibration tasks.

Benchmark: seven categories of eight prompts; summarisation and rewriting carry their own passage
(input-grounded work), the others do not. A user's JSONL (`{"category": ..., "prompt": ...}` per
line) replaces the set.

Calibration: task kinds x topics, held out by whole task kind. Holding out whole kinds (not single
prompts) keeps the held-out acceptance honest: prompts of a kind share phrasing the exit adapter
would otherwise memorise.
"""
from __future__ import annotations

from pathlib import Path

from .errors import ConfigError
from .jsonl import read_objects

PASSAGES = [
    "The town council voted on Tuesday to convert the old railway depot into a public library. The building, "
    "closed since 1998, will keep its brick facade and iron roof. Work starts in spring and should take two "
    "years. The council expects the library to hold forty thousand books and a small cafe for visitors.",
    "Honeybees communicate the location of food with a waggle dance. The angle of the dance relative to "
    "vertical shows the direction of the food relative to the sun, and the length of the waggle run shows "
    "the distance. Other bees follow the dancer and then fly out to find the flowers themselves.",
    "Our quarterly sales rose by twelve percent, driven by strong demand for the new line of electric bikes. "
    "Costs also increased because of higher shipping prices. The company plans to open two new stores in "
    "the north and to hire thirty additional staff before the end of the year.",
    "A heat pump moves heat instead of producing it. In winter it extracts warmth from the outside air, even "
    "when that air is cold, and releases it inside the house. In summer the process runs in reverse and the "
    "same device cools the home. Because it moves heat, it uses far less electricity than a heater.",
    "The museum's new exhibition shows tools used by farmers over the last three centuries. Visitors can see "
    "wooden ploughs, early steam engines and the first tractors. Each object comes with a short film that "
    "explains how it changed daily life in the countryside. The exhibition is open until March.",
    "Regular exercise improves sleep quality. People who walk for thirty minutes a day fall asleep faster and "
    "wake up less often during the night. Experts recommend avoiding intense workouts right before bed, "
    "because they can raise the heart rate and make it harder to relax.",
    "The software update fixes a bug that caused the app to crash when users uploaded large photos. It also "
    "adds a dark mode, improves battery usage, and lets users export their notes as PDF files. The update is "
    "free and will be installed automatically over the next week.",
    "Volcanic eruptions can cool the planet for a few years. They throw sulphur dioxide high into the "
    "atmosphere, where it forms tiny droplets that reflect sunlight back into space. After the 1991 eruption "
    "of Mount Pinatubo, global temperatures dropped by about half a degree for two years.",
]

BENCH_PROMPTS: dict[str, list[str]] = {
    "chat": [
        "Hi! Can you suggest a fun weekend activity for a family with two kids?",
        "What is a good way to start learning to play the guitar?",
        "I feel tired every afternoon. Any tips to stay focused?",
        "Can you recommend three classic novels and say why they are worth reading?",
        "How do I politely decline an invitation to a party?",
        "What should I pack for a three-day hiking trip?",
        "Tell me something interesting about octopuses.",
        "How can I make my small apartment feel bigger?",
    ],
    "code": [
        "Write a Python function that checks whether a string is a palindrome.",
        "Write a Python function that returns the n-th Fibonacci number iteratively.",
        "Write a Python class for a simple stack with push, pop and peek methods.",
        "Write a Python function that counts the words in a text file.",
        "Write a JavaScript function that removes duplicates from an array.",
        "Write a SQL query that finds the five customers with the highest total order value.",
        "Write a Python function that merges two sorted lists into one sorted list.",
        "Write a bash script that prints the ten largest files in a directory.",
    ],
    "summarisation": [f"Summarise the following text in two sentences.\n\n{p}" for p in PASSAGES],
    "rewriting": [f"Rewrite the following text in a more formal tone, keeping every fact.\n\n{p}" for p in PASSAGES],
    "reasoning": [
        "A train travels 60 km in 45 minutes. What is its average speed in km per hour? Explain step by step.",
        "If a shirt costs 25 dollars after a 20 percent discount, what was the original price? Show your work.",
        "Tom is twice as old as Anna. In five years their ages will add up to 40. How old is Anna now?",
        "What is the sum of all integers from 1 to 100? Explain the method.",
        "A rectangle has a perimeter of 30 cm and a length of 9 cm. What is its area? Explain.",
        "If you flip a fair coin three times, what is the probability of getting exactly two heads? Explain.",
        "A recipe needs 3 eggs for 12 cookies. How many eggs are needed for 30 cookies? Explain.",
        "Which is larger, 2 to the power of 10 or 10 to the power of 3? Explain your reasoning.",
    ],
    "qa": [
        "What causes the seasons on Earth?",
        "Why do we have leap years?",
        "How does a vaccine train the immune system?",
        "What is the difference between weather and climate?",
        "Why is the ocean salty?",
        "How do airplanes stay in the air?",
        "What is inflation in economics?",
        "Why do leaves change colour in autumn?",
    ],
    "translation": [
        "Translate into French: The weather is beautiful today and we are going to the beach.",
        "Translate into Spanish: Where is the nearest train station, please?",
        "Translate into German: I would like to book a table for two people tonight.",
        "Translate into French: My brother works as a doctor in a large hospital.",
        "Translate into Spanish: The meeting has been moved to Thursday afternoon.",
        "Translate into German: We visited the old castle and walked along the river.",
        "Translate into Italian: Thank you very much for your help yesterday.",
        "Translate into French: Please turn off the lights when you leave the room.",
    ],
}


def bench_prompts() -> dict[str, list[str]]:
    """The built-in benchmark set: category -> prompts."""
    return {k: list(v) for k, v in BENCH_PROMPTS.items()}


def load_bench_prompts(path: Path) -> dict[str, list[str]]:
    """A user's JSONL: {"category": str, "prompt": str} per line (category defaults to 'custom')."""
    out: dict[str, list[str]] = {}
    for number, item in read_objects(path, '{"category": "chat", "prompt": "..."}'):
        if not isinstance(item, dict) or not isinstance(item.get("prompt"), str):
            raise ConfigError(f"{path}:{number} needs a 'prompt' string (and optionally 'category')")
        out.setdefault(str(item.get("category", "custom")), []).append(item["prompt"])
    return out


# --------------------------------------------------------------------------- calibration
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


def calibration_conversations(held_out: bool) -> list[list[dict]]:
    """Chat conversations of the training (held_out=False) or held-out task kinds."""
    tasks = [t for t in TASKS if (t in HELD_OUT_TASKS) == held_out]
    return [[{"role": "user", "content": TASKS[task].format(t=topic)}]
            for task in tasks for topic in TOPICS]


def load_calibration_prompts(path: Path) -> list[list[dict]]:
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
