"""Per-generation statistics: what was drafted, what was accepted, and how fast."""
from __future__ import annotations

from dataclasses import dataclass, field


def add_positions(into: list[list[int]], counts: list[list[int]]) -> None:
    """Add per-draft-position [reached, accepted] counts into `into`, lengthening it as needed."""
    into += [[0, 0] for _ in range(len(counts) - len(into))]
    for j, (reached, accepted) in enumerate(counts):
        into[j][0] += reached
        into[j][1] += accepted


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens whose KV rows an earlier generation left (prefix reuse)
    generated_tokens: int = 0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    draft_s: float = 0.0    # time spent drafting (draft graph + draft head, lookup)
    verify_s: float = 0.0   # time spent in verify passes (verify graph + head)
    first_token_s: float | None = None
    finish_reason: str = "length"  # "stop" (EOS or a stop string) or "length"
    accepted_histogram: dict[int, int] = field(default_factory=dict)
    by_source: dict[str, list[int]] = field(default_factory=dict)  # source -> [rounds, drafted, accepted]
    round_sizes: dict[str, dict[int, int]] = field(default_factory=dict)  # source -> {tokens drafted: rounds}
    positions: dict[str, list[list[int]]] = field(default_factory=dict)  # source -> [[reached, accepted] per j]

    def record_round(self, source: str, drafted: int, accepted: int) -> None:
        self.rounds += 1
        self.drafted += drafted
        self.accepted += accepted
        self.accepted_histogram[accepted] = self.accepted_histogram.get(accepted, 0) + 1
        entry = self.by_source.setdefault(source, [0, 0, 0])
        entry[0] += 1
        entry[1] += drafted
        entry[2] += accepted
        sizes = self.round_sizes.setdefault(source, {})
        sizes[drafted] = sizes.get(drafted, 0) + 1
        self._record_positions(source, [[int(j <= accepted), int(j < accepted)] for j in range(drafted)])

    def _record_positions(self, source: str, counts: list[list[int]]) -> None:
        add_positions(self.positions.setdefault(source, []), counts)

    def per_position(self, source: str) -> list[float]:
        """P(the j-th draft accepted | the ones before it were), j = 1, 2, …: a drafter's acceptance
        by draft position (the j-th is only judged once all before it were accepted)."""
        return [a / r if r else 0.0 for r, a in self.positions.get(source, [])]

    def merge(self, other: "GenerationStats") -> None:
        """Add another generation's counts (for totals over many prompts)."""
        self.prompt_tokens += other.prompt_tokens
        self.generated_tokens += other.generated_tokens
        self.rounds += other.rounds
        self.drafted += other.drafted
        self.accepted += other.accepted
        self.prefill_s += other.prefill_s
        self.decode_s += other.decode_s
        self.draft_s += other.draft_s
        self.verify_s += other.verify_s
        for k, v in other.accepted_histogram.items():
            self.accepted_histogram[k] = self.accepted_histogram.get(k, 0) + v
        for source, counts in other.by_source.items():
            mine = self.by_source.setdefault(source, [0, 0, 0])
            for i, v in enumerate(counts):
                mine[i] += v
        for source, sizes in other.round_sizes.items():
            mine = self.round_sizes.setdefault(source, {})
            for drafted, rounds in sizes.items():
                mine[drafted] = mine.get(drafted, 0) + rounds
        for source, counts in other.positions.items():
            self._record_positions(source, counts)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_round(self) -> float:
        """τ: tokens committed per verify pass (1.0 for plain decoding)."""
        return (self.accepted + self.rounds) / self.rounds if self.rounds else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.decode_s if self.decode_s > 0 else 0.0

    def summary(self) -> str:
        return (
            f"{self.generated_tokens} tokens, {self.tokens_per_second:.1f} tok/s, "
            f"acceptance {self.acceptance_rate:.1%}, {self.tokens_per_round:.2f} tokens/round, "
            f"first token {1000 * (self.first_token_s or 0):.0f} ms"
        )

    def to_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "generated_tokens": self.generated_tokens,
            "rounds": self.rounds,
            "draft_tokens": self.drafted,
            "accepted_tokens": self.accepted,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "tokens_per_round": round(self.tokens_per_round, 4),
            "tokens_per_second": round(self.tokens_per_second, 2),
            "time_to_first_token_s": round(self.first_token_s or 0.0, 4),
            "draft_time_s": round(self.draft_s, 4),
            "verify_time_s": round(self.verify_s, 4),
            "accepted_histogram": {str(k): v for k, v in sorted(self.accepted_histogram.items())},
            "by_source": {
                s: {"rounds": r, "draft_tokens": d, "accepted_tokens": a}
                for s, (r, d, a) in self.by_source.items()
            },
            "round_sizes": {s: {str(k): v for k, v in sorted(sizes.items())} for s, sizes in self.round_sizes.items()},
            "acceptance_per_position": {s: [round(a, 4) for a in self.per_position(s)] for s in self.positions},
        }
