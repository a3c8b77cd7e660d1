"""Could a static n-gram table (llama.cpp's static lookup cache) make copying pay where the context offers little?

Usage: python lab/scripts/static_ngram_bound.py BUNDLE [--corpus-prompts 180] [--corpus-tokens 96]
                                            [--prompts-per-category 4] [--max-tokens 64]
Builds the table llama.cpp's `llama-lookup-create` builds for `--lookup-cache-static`, from the
model's own text: the bundle's greedy answers to the calibration training conversations, every
n-gram (1..4 tokens) mapped to the token that most often followed it. Then decodes the bench
prompts plainly (EOS ignored) and prices each category's rounds with passes timed on the bundle,
three ways: the clairvoyant copy from the context alone (the bench report's lookup bound); from the
context or the table, every round taking whichever continuation holds longest, the table offering
for each n the chain of most frequent next tokens (backing off to shorter n-grams where one is
missing) — a bound no drafter proposing the table's continuations can beat, but one that knows
which of its proposals hold; and the context's clairvoyant copy plus, where none holds, one table
token in the evidence classes (n-gram length, the follower's share, how often the n-gram was seen)
whose acceptance on these very outputs pays for the row it adds — what a drafter that learned
each class's acceptance perfectly could add.
"""
from __future__ import annotations

import argparse
from collections import Counter, defaultdict

import numpy as np

from specdeploy import Engine, GenerationConfig
from specdeploy.bench.bound import best_copy, clairvoyant_rounds, pass_cost
from sides import encode
from specdeploy.prompts import bench_prompts, calibration_conversations
from specdeploy.runtime.costs import measure

ORDER = 4  # longest n-gram in the table, as llama.cpp's static cache
SHARES = (0.0, 0.5, 0.7, 0.9)  # share buckets of an entry's most frequent follower
MANY = 5  # an entry followed this often or more is "seen often"


def build_table(texts: list[list[int]], order: int = ORDER) -> dict[tuple[int, ...], tuple[int, float, int]]:
    """Each n-gram (n = 1..order) of `texts` -> (the token that most often followed it, ties to the
    first seen; its share of what followed; how often the n-gram was followed)."""
    follows: dict[tuple[int, ...], Counter] = defaultdict(Counter)
    for text in texts:
        for end in range(1, len(text)):
            for n in range(1, min(order, end) + 1):
                follows[tuple(text[end - n : end])][text[end]] += 1
    table = {}
    for key, counts in follows.items():
        (token, count), total = counts.most_common(1)[0], sum(counts.values())
        table[key] = (token, count / total, total)
    return table


def evidence(table: dict, history: list[int], order: int = ORDER) -> tuple[tuple, int] | None:
    """(class, token) of the table's proposal after `history`: the longest n-gram it holds, with that
    entry's share and count in coarse buckets (what a drafter could learn acceptance by); None if none."""
    for n in range(min(order, len(history)), 0, -1):
        entry = table.get(tuple(history[-n:]))
        if entry:
            token, share, total = entry
            return (n, max(b for b in SHARES if share >= b), total >= MANY), token
    return None


def chain(table: dict, history: list[int], n: int, room: int) -> list[int]:
    """Up to `room` tokens: the most frequent follower of the last n tokens, then of the last n with
    it appended, and so on, backing off to shorter n-grams where the table lacks one."""
    tokens = list(history)
    for _ in range(room):
        entry = next((table[key] for m in range(min(n, len(tokens)), 0, -1)
                      if (key := tuple(tokens[-m:])) in table), None)
        if entry is None:
            break
        tokens.append(entry[0])
    return tokens[len(history):]


def table_copy(table: dict, history: list[int], future: list[int], room: int, order: int = ORDER) -> int:
    """Longest prefix of `future` that the table's chain from any n-gram order reproduces."""
    best = 0
    for n in range(1, order + 1):
        offered = chain(table, history, n, min(room, len(future)))
        best = max(best, int(np.cumprod(np.equal(offered, future[: len(offered)])).sum()) if offered else 0)
    return best


def rounds_with_table(prompt: list[int], output: list[int], table: dict, ngram: tuple[int, int],
                      num_draft_tokens: int) -> tuple[list[int], int]:
    """(accepted drafts per round, rounds where only the table's continuation held longest), each round
    copying the longest continuation the context or the table offers (bench.bound.clairvoyant_rounds
    with the table as a second source)."""
    tokens = list(prompt) + list(output)
    array, start, position = np.asarray(tokens, np.int64), len(prompt), 1
    rounds, from_table = [], 0
    while position < len(output):
        room = min(num_draft_tokens, len(output) - position - 1)
        here = start + position
        context = best_copy(array[:here], array[here:], ngram, room)
        static = table_copy(table, tokens[:here], tokens[here:], room) if room else 0
        from_table += static > context
        rounds.append(max(context, static))
        position += rounds[-1] + 1
    return rounds, from_table


def first_proposals(table: dict, pairs, ngram: tuple[int, int]) -> dict[tuple, list[int]]:
    """[positions, accepted] of the table's first proposal by evidence class, at every position of
    the outputs where no context copy holds (where a table could add a token)."""
    counts: dict[tuple, list[int]] = {}
    for prompt, output in pairs:
        tokens = list(prompt) + list(output)
        array = np.asarray(tokens, np.int64)
        for here in range(len(prompt) + 1, len(tokens)):
            found = evidence(table, tokens[:here])
            if found and best_copy(array[:here], array[here:], ngram, 1) == 0:
                c = counts.setdefault(found[0], [0, 0])
                c[0], c[1] = c[0] + 1, c[1] + int(found[1] == tokens[here])
    return counts


def rounds_with_classes(prompt: list[int], output: list[int], table: dict, paying: set, ngram: tuple[int, int],
                        num_draft_tokens: int) -> list[tuple[int, int]]:
    """(accepted, drafted) per round: the context's clairvoyant copy where one holds, else one table
    token where its evidence class is in `paying`, else a plain step."""
    tokens = list(prompt) + list(output)
    array, start, position, rounds = np.asarray(tokens, np.int64), len(prompt), 1, []
    while position < len(output):
        room = min(num_draft_tokens, len(output) - position - 1)
        here = start + position
        context = best_copy(array[:here], array[here:], ngram, room)
        found = evidence(table, tokens[:here]) if context == 0 and room else None
        if found and found[0] in paying:
            rounds.append((int(found[1] == tokens[here]), 1))
        else:
            rounds.append((context, context))
        position += rounds[-1][0] + 1
    return rounds


def speedup(rounds: list[tuple[int, int]], costs) -> float:
    """Plain steps' seconds for the rounds' tokens over the rounds' own passes (drafted + 1 rows each)."""
    tokens = sum(accepted + 1 for accepted, _ in rounds)
    return tokens * pass_cost(costs, 1) / sum(pass_cost(costs, drafted + 1) for _, drafted in rounds)


def corpus(engine: Engine, prompts: int, max_tokens: int) -> list[list[int]]:
    """The model's own greedy answers (prompt tail included, for the first n-grams) to the training conversations."""
    config = GenerationConfig(speculative=False, max_new_tokens=max_tokens)
    texts = []
    for conversation in calibration_conversations(held_out=False)[:prompts]:
        ids = engine.encode_prompt(conversation)
        texts.append(list(ids[-ORDER:]) + list(engine.generate_ids(ids, config, None)))
    return texts


def decode(engine: Engine, per_category: int, max_tokens: int) -> dict[str, list[tuple[list[int], list[int]]]]:
    config = GenerationConfig(speculative=False, max_new_tokens=max_tokens, ignore_eos=True)
    return {category: [(ids, list(engine.generate_ids(ids, config, None)))
                       for ids in (encode(engine, p) for p in prompts[:per_category])]
            for category, prompts in bench_prompts().items()}


def category_rounds(pairs, table: dict, paying: set, ngram: tuple[int, int], gamma: int) -> tuple[dict, int]:
    """The (accepted, drafted) rounds of each way of drafting over `pairs`, and the rounds the table alone won."""
    both = [rounds_with_table(p, o, table, ngram, gamma) for p, o in pairs]
    rounds = {"context": [(r, r) for p, o in pairs for r in clairvoyant_rounds(p, o, ngram, gamma)],
              "table": [(r, r) for found, _ in both for r in found],
              "paying": [r for p, o in pairs for r in rounds_with_classes(p, o, table, paying, ngram, gamma)]}
    return rounds, sum(won for _, won in both)


def report(outputs: dict, table: dict, costs, ngram: tuple[int, int], gamma: int) -> list[str]:
    """One line per category and overall: the two bounds, and one table token a round in the classes
    whose acceptance on these outputs pays for a second row (a hindsight choice no drafter beats)."""
    price = pass_cost(costs, 2) / pass_cost(costs, 1) - 1                    # a second row, in steps
    classes = first_proposals(table, [pair for pairs in outputs.values() for pair in pairs], ngram)
    paying = {c for c, (n, accepted) in classes.items() if accepted > price * n}
    lines = [f"a second row costs {price:.2f} steps; table proposals where no context copy holds: "
             f"{sum(n for n, _ in classes.values())}, accepted {sum(a for _, a in classes.values())}; "
             f"{len(paying)} of {len(classes)} evidence classes pay",
             f"{'category':14s} {'context':>8s} {'+ table':>8s} {'+ paying':>9s}  rounds the table alone won"]
    overall, won_overall = {"context": [], "table": [], "paying": []}, 0
    for category, pairs in outputs.items():
        rounds, won = category_rounds(pairs, table, paying, ngram, gamma)
        for key in overall:
            overall[key] += rounds[key]
        won_overall += won
        lines.append(_line(category, rounds, won, costs))
    return lines + [_line("overall", overall, won_overall, costs)]


def _line(category: str, rounds: dict, won: int, costs) -> str:
    r = {key: speedup(found, costs) for key, found in rounds.items()}
    return (f"{category:14s} {r['context']:7.3f}× {r['table']:7.3f}× {r['paying']:8.3f}×  "
            f"{won} of {len(rounds['table'])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("--corpus-prompts", type=int, default=len(calibration_conversations(held_out=False)))
    parser.add_argument("--corpus-tokens", type=int, default=96)
    parser.add_argument("--prompts-per-category", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    with Engine(args.bundle) as engine:
        settings = engine.settings(GenerationConfig())
        ngram, gamma = settings.lookup_ngram, settings.num_draft_tokens
        table = build_table(corpus(engine, args.corpus_prompts, args.corpus_tokens))
        outputs = decode(engine, args.prompts_per_category, args.max_tokens)
        costs = measure(engine.model, max_rows=gamma + 1)
    print(f"table: {len(table)} n-grams from {args.corpus_prompts} answers; lookup n-grams {ngram[0]}..{ngram[1]}, γ {gamma}")
    print("\n".join(report(outputs, table, costs, ngram, gamma)))


if __name__ == "__main__":
    from sides import run_script

    run_script(main)
