"""What the default's lookup copy choices are worth without timing noise, per category.

Usage: python lab/scripts/copy_replay.py BUNDLE [--prompts-per-category 4] [--max-tokens 64] [--repeats 3]
                                     [--row-costs 0.11 0.21]
Decodes the bench prompts once, plain and greedy; then replays each output round by round, as the
default decodes it: the lookup search of the runtime, and copy lengths chosen by the runtime's own
`CopyLength`, whose measurements carry over from category to category and repeat to repeat as in
one engine. Each round is priced in plain steps, a round verifying r rows at cost(r) / cost(1):
from passes timed here (`measured`), and from each --row-costs c as 1 + c (r - 1). Beside the
default: its pricing with contested matches pooled (before they had classes of their own), copying
all a match offers, a fixed rule (one token after a 2-token agreement, all of it after 4), and the
clairvoyant bound of the bench's report. Greedy output does not depend on these choices, so the
replay prices exactly the rounds decoding would run, under timings that do not move: what
separates a choice that wins from one that only met a fast moment of the machine.
The default's early-exit probes are not replayed (a few rounds a run). Last, how often a first
copy would be accepted at every position of the outputs, by the match's evidence class (its
agreement, contested or not): what the classes separate.
"""
from __future__ import annotations

import argparse

import numpy as np

from specdeploy import Engine, GenerationConfig
from specdeploy.bench.bound import clairvoyant_rounds, pass_cost
from sides import encode
from specdeploy.prompts import bench_prompts
from policies import CopyAll, FixedRule, Pooled
from specdeploy.runtime.copy_length import CONTESTED, CopyLength
from specdeploy.runtime.costs import measure
from specdeploy.runtime.drafting import find_continuation


def replay_output(chooser, prompt: list[int], output: list[int], price, ngram, num_draft_tokens: int):
    """(tokens, steps) of the rounds after the prefill's token, each priced by price(rows) in steps."""
    tokens = np.asarray(list(prompt) + list(output), np.int64)
    start, position, emitted, steps = len(prompt), 1, 0, 0.0
    while position < len(output):
        room = min(num_draft_tokens, len(output) - position - 1)
        offered, match = find_continuation(tokens[: start + position], room, *ngram)
        drafted = chooser.choose(match, len(offered)) if match and len(offered) else 0
        copied, future = offered[:drafted], tokens[start + position : start + position + drafted]
        accepted = int(np.cumprod(copied == future).sum())
        cost = price(drafted + 1)
        chooser.observe(drafted + 1, match if drafted else 0, drafted, accepted, cost)
        emitted, steps, position = emitted + accepted + 1, steps + cost, position + accepted + 1
    return emitted, steps


def _speedups(rounds) -> dict[str, float]:
    """Tokens per plain step by category and overall, from (category, tokens, steps) items."""
    totals: dict[str, list[float]] = {}
    for category, tokens, steps in rounds:
        for key in (category, "overall"):
            t = totals.setdefault(key, [0, 0.0])
            t[0], t[1] = t[0] + tokens, t[1] + steps
    return {k: tokens / steps for k, (tokens, steps) in totals.items() if steps}


def replay(chooser, outputs, price, ngram, num_draft_tokens: int, repeats: int) -> dict[str, float]:
    """Priced speedup over plain steps per category and overall; one chooser throughout."""
    return _speedups((category, *replay_output(chooser, prompt, output, price, ngram, num_draft_tokens))
                     for _ in range(repeats) for category, prompt, output in outputs)


def bound(outputs, price, ngram, num_draft_tokens: int) -> dict[str, float]:
    return _speedups((category, accepted + 1, price(accepted + 1)) for category, prompt, output in outputs
                     for accepted in (clairvoyant_rounds(prompt, output, ngram, num_draft_tokens) if output else []))


def first_copy_acceptance(outputs, ngram, num_draft_tokens: int) -> dict[tuple[int, bool], list[int]]:
    """[positions, first copies accepted] by (agreement up to 4, contested), over every position
    of every output where the search finds a match."""
    counts: dict[tuple[int, bool], list[int]] = {}
    for _, prompt, output in outputs:
        tokens = np.asarray(list(prompt) + list(output), np.int64)
        for position in range(1, len(output)):
            offered, match = find_continuation(tokens[: len(prompt) + position], num_draft_tokens, *ngram)
            if len(offered):
                c = counts.setdefault((min(match % CONTESTED, 4), match >= CONTESTED), [0, 0])
                c[0], c[1] = c[0] + 1, c[1] + int(offered[0] == tokens[len(prompt) + position])
    return counts


def decode(engine: Engine, per_category: int, max_tokens: int):
    config = GenerationConfig(speculative=False, max_new_tokens=max_tokens)
    outputs = []
    for category, prompts in bench_prompts().items():
        for prompt in prompts[:per_category]:
            ids = encode(engine, prompt)
            outputs.append((category, ids, engine.generate_ids(ids, config, None)))
    return outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("--prompts-per-category", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--row-costs", type=float, nargs="*", default=[])
    args = parser.parse_args()
    with Engine(args.bundle) as engine:
        settings = engine.settings(GenerationConfig())
        ngram, gamma = settings.lookup_ngram, settings.num_draft_tokens
        outputs = decode(engine, args.prompts_per_category, args.max_tokens)
        costs = measure(engine.model, max_rows=gamma + 1)
    timed = [pass_cost(costs, rows) / pass_cost(costs, 1) for rows in range(1, gamma + 2)]
    prices = {"measured (" + " / ".join(f"{t:.2f}" for t in timed) + " steps for 1..{} rows)".format(gamma + 1):
              lambda rows: timed[rows - 1]}
    prices.update({f"1 + {c} (rows - 1)": (lambda rows, c=c: 1.0 + c * (rows - 1)) for c in args.row_costs})
    for label, price in prices.items():
        columns = {"default": replay(CopyLength(), outputs, price, ngram, gamma, args.repeats),
                   "pooled": replay(Pooled(), outputs, price, ngram, gamma, args.repeats),
                   "copy all": replay(CopyAll(), outputs, price, ngram, gamma, args.repeats),
                   "fixed rule": replay(FixedRule(), outputs, price, ngram, gamma, args.repeats),
                   "bound": bound(outputs, price, ngram, gamma)}
        print(f"rounds priced at {label}")
        print(f"{'category':14s} " + " ".join(f"{name:>10s}" for name in columns))
        categories = [c for c in columns["bound"] if c != "overall"] + ["overall"]
        for category in categories:
            print(f"{category:14s} " + " ".join(f"{c.get(category, 1.0):9.3f}×" for c in columns.values()))
    print("first copies accepted, every position, by agreement (4: 4 or more): uncontested | contested")
    counts = first_copy_acceptance(outputs, ngram, gamma)
    for agreement in range(1, 5):
        cells = [f"{a / n:.2f} of {n}" if n else "-" for n, a in (counts.get((agreement, c), (0, 0)) for c in (False, True))]
        print(f"  {agreement}: " + " | ".join(cells))


if __name__ == "__main__":
    from sides import run_script

    run_script(main)
