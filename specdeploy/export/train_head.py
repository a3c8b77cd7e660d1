"""`specdeploy train-head`: conversations in, an EAGLE-3 head out, its acceptance measured.

The target's features and distributions over the training text are computed once, by the exported
bundle's own graphs where `--bundle` names one (the distribution the head will draft against, at
the bundle's speed) or else by the PyTorch model, and cached under a fingerprint of the model (or
bundle) file, the text and the settings; training checkpoints beside them, so
an interrupted run resumes where it stopped. Acceptance is replayed over the target's own greedy
replies to held-out conversations (never trained on).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from ..bundle.manifest import MANIFEST_FILE
from ..errors import ConfigError, require
from ..feature_head import eagle3
from ..feature_head.config import HeadConfig
from ..feature_head.data import FeatureConfig, Features, fingerprint, read_conversations, render, teacher_force
from ..feature_head.evaluate import Acceptance
from ..feature_head.train import TrainConfig


@dataclass(frozen=True)
class TrainHeadConfig:
    source: Path                    # the target: a Hugging Face directory or a .gguf file
    data: Path                      # conversations, JSONL
    output: Path                    # the head, in the EAGLE-3 format
    tokens: int = 300_000           # training positions (the target teacher-forced over them)
    draft_vocab_size: int = 8192
    intermediate_size: int | None = None   # the head's MLP width (default: the target's)
    train: TrainConfig = TrainConfig()
    held_out: int = 32              # conversations kept out of training, to measure acceptance on
    reply_tokens: int = 64          # the target's greedy reply to each held-out prompt
    gamma: int = 4
    device: str = "cpu"             # where the PyTorch model and the training run (cuda: both on the GPU)
    bundle: Path | None = None      # teacher-force with this bundle's graphs (exported with --features)

    def __post_init__(self):
        if not Path(self.data).is_file():
            raise ConfigError(f"--data {self.data} does not exist; give a JSONL file of conversations")
        if self.tokens < 1000 or self.draft_vocab_size < 2 or self.held_out < 1:
            raise ConfigError("--tokens must be >= 1000, --draft-vocab >= 2 and --held-out >= 1")
        if self.device not in ("cpu", "cuda"):
            raise ConfigError(f"--device {self.device}: pick cpu or cuda")
        if self.bundle is not None and not (Path(self.bundle) / MANIFEST_FILE).is_file():
            raise ConfigError(f"--bundle {self.bundle} is not a bundle (no {MANIFEST_FILE}); export one with "
                              f"`specdeploy export --features MODEL -o BUNDLE`")

    @property
    def teacher_file(self) -> Path:
        """What the cached features are a fingerprint of."""
        return Path(self.bundle) / MANIFEST_FILE if self.bundle is not None else Path(self.source)


def cache_dir() -> Path:
    from ..calibration.data import cache_dir as root

    return root() / "feature_head"


def _features(teacher, tokenizer, config: TrainHeadConfig, texts: list[str], layers, echo) -> Features:
    settings = FeatureConfig(tuple(layers), max_total_tokens=config.tokens)
    path = cache_dir() / f"features-{fingerprint(config.teacher_file, texts, settings)}.npz"
    if path.is_file():
        cached = Features.load(path)
        if np.isfinite(cached.features).all():  # a cache from before features overflowing fp16 were kept in fp32
            echo(f"target features: cached ({path})")
            return cached
    progress = Progress(config.tokens, f"teacher-forcing the target ({teacher.name})", echo)
    features = teacher_force(teacher, tokenizer, texts, settings, progress)
    features.save(path)
    return features


def _replies(generate, teacher, tokenizer, prompts: list[list[dict] | str], layers, echo) -> tuple[Features, np.ndarray]:
    """The target's greedy replies to held-out prompts (`generate`: prompt ids -> prompt and reply
    ids), teacher-forced; [N] True where a round may start."""
    texts, first = [], []
    for prompt in prompts:
        turn = prompt[:1] if isinstance(prompt, list) else [{"role": "user", "content": prompt[:2000]}]
        text = (tokenizer.apply_chat_template(turn, tokenize=False, add_generation_prompt=True)
                if getattr(tokenizer, "chat_template", None) else turn[0]["content"])
        ids = tokenizer(text, add_special_tokens=False)["input_ids"][-384:]
        texts.append(generate(ids))
        first.append(len(ids) - 1)
    features = teacher_force(teacher, tokenizer, texts, FeatureConfig(tuple(layers), max_tokens=10**6))
    scored = np.zeros(len(features), bool)
    for segment, start in enumerate(first):
        index = np.flatnonzero(features.segment == segment)
        scored[index[start:]] = True
    echo(f"held-out replies: {len(prompts)} prompts, {int(scored.sum())} greedy positions")
    return features, scored


def torch_replies(model, tokenizer, tokens: int, device: str):
    """Greedy generation by the PyTorch model: prompt ids -> prompt and reply ids."""
    import torch

    def generate(ids: list[int]) -> list[int]:
        with torch.no_grad():
            out = model.generate(torch.tensor([ids], device=device), max_new_tokens=tokens, do_sample=False,
                                 pad_token_id=tokenizer.eos_token_id)
        return out[0].tolist()
    return generate


def bundle_replies(engine, tokens: int):
    """Greedy plain decoding by the bundle: prompt ids -> prompt and reply ids."""
    from ..config import UNWARPED, GenerationConfig

    config = GenerationConfig(max_new_tokens=tokens, temperature=0.0, speculative=False, **UNWARPED)
    return lambda ids: list(ids) + engine.generate_ids(ids, config)


class Progress:
    """One line per tenth of the work, with the rate and an ETA (a log-friendly progress bar)."""

    def __init__(self, total: int, what: str, echo):
        self.total, self.what, self.echo, self.done, self.next = total, what, echo, 0, total / 10
        self.start = time.perf_counter()

    def __call__(self, n: int) -> None:
        self.done += n
        if self.done >= self.next or self.done >= self.total:
            rate = self.done / (time.perf_counter() - self.start)
            left = max(0.0, (self.total - self.done) / max(rate, 1e-9))
            self.echo(f"{self.what}: {min(self.done, self.total):,}/{self.total:,}, {rate:,.0f}/s, ETA {left / 60:.1f} min")
            self.next += self.total / 10


def new_head(model, config: TrainHeadConfig, features: Features):
    """A head shaped after the target, its LM head and final norm started from the target's own
    (rows of the draft vocabulary), the rest random as EAGLE starts it."""
    import torch

    from ..calibration.vocab import choose
    from ..calibration.data import Activations
    from ..feature_head.model import FeatureHead, final_norm_weight

    target = model.config
    vocab = choose(Activations({}, features.teacher_ids, features.teacher_probs.astype(np.float32),
                               features.segment), target.vocab_size, config.draft_vocab_size)
    head_config = HeadConfig.for_target(target, draft_vocab_size=len(vocab))
    if config.intermediate_size:
        head_config = HeadConfig(**{**asdict(head_config), "intermediate_size": config.intermediate_size})
    head = FeatureHead(head_config)
    d2t, t2d = eagle3.vocab_maps(vocab, target.vocab_size)
    with torch.no_grad():
        head.d2t.copy_(torch.from_numpy(d2t))
        head.t2d.copy_(torch.from_numpy(t2d))
        head.lm_head.weight.copy_(model.lm_head.weight[torch.from_numpy(vocab)])
        head.norm.weight.copy_(final_norm_weight(model))
    return head


def choose_teacher(config: TrainHeadConfig, model, tokenizer, layers, echo):
    """(the teacher, greedy generation for the held-out replies, what closes them)."""
    from ..feature_head.teachers import BundleTeacher, TorchTeacher

    if config.bundle is None:
        echo(f"teacher: the PyTorch model (fp32, {config.device}); --bundle teacher-forces with an exported "
             f"bundle's own graphs (the distribution the head drafts against)")
        return (TorchTeacher(model, layers, config.device), torch_replies(model, tokenizer, config.reply_tokens,
                                                                          config.device), lambda: None)
    from ..runtime.engine import Engine

    engine = Engine(config.bundle)
    try:
        taught = BundleTeacher(engine.model, layers)
    except Exception:
        engine.close()
        raise
    echo(f"teacher: the bundle's graphs ({config.bundle}, prefill passes of {taught.chunk} rows)")
    return taught, bundle_replies(engine, config.reply_tokens), engine.close


def train_head(config: TrainHeadConfig, echo: Callable[[str], None] = print) -> tuple[Path, Acceptance]:
    require("torch", "export", "training a feature head")
    from .arch import load

    model, tokenizer = load(config.source)
    conversations = read_conversations(config.data)
    if len(conversations) <= config.held_out:
        raise ConfigError(f"{config.data} has {len(conversations)} conversations; training needs more than "
                          f"--held-out {config.held_out}")
    layers = HeadConfig.for_target(model.config).feature_layers
    taught, generate, close = choose_teacher(config, model, tokenizer, layers, echo)
    try:
        return _train(config, model, tokenizer, conversations, layers, taught, generate, echo)
    finally:
        close()


def _train(config: TrainHeadConfig, model, tokenizer, conversations, layers, taught, generate, echo):
    from ..feature_head.evaluate import acceptance
    from ..feature_head.model import TokenEmbedding
    from ..feature_head.train import train

    held, rest = conversations[: config.held_out], conversations[config.held_out:]
    features = _features(taught, tokenizer, config, [render(tokenizer, c) for c in rest], layers, echo)
    head = new_head(model, config, features)
    embed = TokenEmbedding(model, copy=True)
    echo(f"head: {sum(p.numel() for p in head.parameters()) / 1e6:.1f}M parameters, draft vocabulary "
         f"{head.config.draft_vocab_size}, features from layers {list(layers)}; {len(features):,} positions")
    settings = [str(Path(config.data).resolve()), len(features), asdict(config.train), config.draft_vocab_size,
                config.intermediate_size, str(config.teacher_file)]
    checkpoint = cache_dir() / f"train-{fingerprint(config.teacher_file, settings, FeatureConfig(layers))}.pt"

    def report(step, loss, agreement, eta):
        if step % max(1, config.train.steps // 20) == 0 or step == config.train.steps:
            agree = " ".join(f"{a:.2f}" for a in agreement)
            echo(f"step {step}/{config.train.steps}: loss {loss:.3f}, agreement per step {agree}, ETA {eta / 60:.1f} min")

    head = train(head.to(config.device), embed.to(config.device), features, config.train, checkpoint, report)
    tensors = {k: v.detach().cpu().numpy() for k, v in head.state_dict().items()}
    eagle3.write(config.output, head.config, tensors)
    replies, scored = _replies(generate, taught, tokenizer, held, layers, echo)
    measured = acceptance(head.cpu(), embed.cpu(), replies, config.gamma, scored)
    echo(f"held-out: {measured.line()}")
    eagle3.write_acceptance(config.output, {
        "per_position": [round(a, 4) for a in measured.per_position], "tau": round(measured.tau, 4),
        "rounds": measured.rounds, "training_positions": len(features), "held_out_conversations": config.held_out,
        "teacher": "bundle" if config.bundle is not None else "pytorch",
        "measured_on": "greedy drafting replayed over the model's own replies to held-out prompts"})
    return Path(config.output), measured
