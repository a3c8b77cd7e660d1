"""A Hugging Face checkpoint of a real edge model's shape with random weights, written in bounded memory.

    python scripts/make_checkpoint.py qwen2.5-1.5b -o models/qwen2.5-1.5b-random
    python scripts/make_checkpoint.py qwen2.5-1.5b --gguf -o models/qwen2.5-1.5b-random-q4_0.gguf
    python scripts/make_checkpoint.py qwen2.5-1.5b --gguf q4_k_m -o models/qwen2.5-1.5b-random-q4_k_m.gguf
    python scripts/make_checkpoint.py --list

For measuring export and decoding at the sizes users ship (1-8B) without downloading them: the
config is the model's own shape, the parameter names and shapes come from the family's Hugging
Face module built on the meta device (no memory), and `model.safetensors` is written one tensor at
a time in chunks (bf16, as checkpoints ship), so an 8B file is made in a few hundred MB. The
tokenizer is byte-level (any text encodes, a token a byte), padded to the model's vocabulary size,
with a chat template; --tokenizer-from takes a real model's instead (a GGUF file's, such as the
example's, or a Hugging Face directory's), so that a text makes as many tokens as it would for a
real model (the byte-level one makes about five times as many: GPTQ's calibration rows, prompts).
With --gguf the same shape is written as a llama.cpp file instead: layer weights Q4_0, the
embedding and output Q8_0, norms and biases F32 (llama.cpp's Q4_0 layout), the byte-level
vocabulary and chat template in its metadata, one tensor in memory at a time. `--gguf q4_k_m`
writes the mix most GGUF downloads are: Q4_K layer weights, Q6_K for the output (or a tied
embedding) and for attn_v / ffn_down on the layers llama.cpp gives more bits (its
`llama_tensor_get_type` for Q4_K_M), by a Q4_K / Q6_K writer of our own (`q4_k_bytes`,
`q6_k_bytes`: min / max per block, as simple as the format allows; gguf-py does not quantize
K-quants), whose files gguf-py and llama.cpp read as theirs. `--gguf q5_k_m` the same with Q5_K
layer weights (`q5_k_bytes`).
Random weights decode nonsense; their memory and speed are a real model's.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

SHAPES = {  # the public configs' shapes
    "qwen2.5-0.5b": dict(model_type="qwen2", hidden_size=896, num_hidden_layers=24, intermediate_size=4864,
                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(model_type="qwen2", hidden_size=1536, num_hidden_layers=28, intermediate_size=8960,
                         num_attention_heads=12, num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-3b": dict(model_type="qwen2", hidden_size=2048, num_hidden_layers=36, intermediate_size=11008,
                       num_attention_heads=16, num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "llama3.1-8b": dict(model_type="llama", hidden_size=4096, num_hidden_layers=32, intermediate_size=14336,
                        num_attention_heads=32, num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False,
                        rope_theta=500000.0),
}
GGUF_MIXES = ("q4_0", "q4_k_m", "q5_k_m")
CHUNK = 1 << 24  # elements generated at a time
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def parameters(shape: dict) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every stored parameter, from the family's own module on the meta device."""
    import torch
    import transformers

    config = transformers.AutoConfig.for_model(**shape, max_position_embeddings=32768, bos_token_id=0,
                                               eos_token_id=1)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return config, [(name, tuple(p.shape)) for name, p in model.named_parameters()]


def _bf16(values: np.ndarray) -> bytes:
    return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()


def write_safetensors(path: Path, params: list[tuple[str, tuple[int, ...]]], seed: int = 0) -> int:
    """Every parameter as bf16, normal(0, 0.02) (norm weights 1), one chunk in memory at a time."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, dims in params:
        size = 2 * int(np.prod(dims))
        header[name] = {"dtype": "BF16", "shape": list(dims), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    rng = np.random.default_rng(seed)
    with open(path, "wb") as f:
        f.write(len(blob).to_bytes(8, "little") + blob)
        for name, dims in params:
            count = int(np.prod(dims))
            for start in range(0, count, CHUNK):
                n = min(CHUNK, count - start)
                norm = name.endswith("norm.weight")
                f.write(_bf16(np.ones(n, np.float32) if norm else rng.normal(0.0, 0.02, n)))
    return offset


def write_tokenizer(directory: Path, vocab_size: int) -> None:
    """Byte-level: any text encodes, a token a byte (the 256 byte symbols, then fillers to the size)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {"<s>": 0, "</s>": 1, **{c: i + 2 for i, c in enumerate(sorted(alphabet))}}
    vocab.update({f"<w{i}>": i for i in range(len(vocab), vocab_size)})
    tok = Tokenizer(models.BPE(vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.chat_template = TEMPLATE
    fast.save_pretrained(directory)


def copy_tokenizer(source: Path, directory: Path, config) -> None:
    """A real model's tokenizer, its chat template and its BOS / EOS ids into the config."""
    from transformers import AutoTokenizer

    gguf = source.suffix == ".gguf"
    tokenizer = AutoTokenizer.from_pretrained(source.parent if gguf else source,
                                              **({"gguf_file": source.name} if gguf else {}))
    if len(tokenizer) > config.vocab_size:
        raise SystemExit(f"{source}'s tokenizer has {len(tokenizer):,} tokens, more than this shape's "
                         f"{config.vocab_size:,}-row embedding; take a smaller vocabulary's")
    config.bos_token_id, config.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
    tokenizer.save_pretrained(directory)


def q4_k_bytes(values: np.ndarray, top: int = 15) -> np.ndarray:
    """Q4_K blocks uint8 [rows, K/256 * 144] of values [rows, K]: per 32, q in 0..15 on [min(x, 0),
    max(x)], its scale and minimum 6-bit multiples of the super-block's float16 d and dmin
    (`top` 31: Q5_K's values, their fifth bits for `q5_k_bytes`, in place of the low nibbles)."""
    rows, k = values.shape
    x = values.reshape(rows, k // 256, 8, 32)
    lo, hi = np.minimum(x.min(-1), 0), x.max(-1)                                    # [R, S, 8]
    scale, least = (hi - lo) / top, -lo
    d = (np.maximum(scale.max(-1), 1e-8) / 63).astype(np.float16)                 # [R, S]
    dmin = (np.maximum(least.max(-1), 1e-8) / 63).astype(np.float16)
    sc = np.clip(np.rint(scale / d[..., None].astype(np.float32)), 0, 63).astype(np.uint8)
    mn = np.clip(np.rint(least / dmin[..., None].astype(np.float32)), 0, 63).astype(np.uint8)
    step = d[..., None].astype(np.float32) * sc
    q = np.clip(np.rint((x + (dmin[..., None].astype(np.float32) * mn)[..., None]) / np.where(step > 0, step, 1)[..., None]),
                0, top).astype(np.uint8)                                             # [R, S, 8, 32]
    packed = np.concatenate([sc[..., :4] | ((sc[..., 4:] >> 4) << 6), mn[..., :4] | ((mn[..., 4:] >> 4) << 6),
                             (sc[..., 4:] & 0x0F) | ((mn[..., 4:] & 0x0F) << 4)], axis=-1)  # [R, S, 12]
    low = q & 0x0F
    nibbles = low[..., 0::2, :] | (low[..., 1::2, :] << 4)                          # [R, S, 4, 32]
    halves = np.stack([d, dmin], axis=-1).view(np.uint8)                            # [R, S, 4]
    if top == 31:  # Q5_K: byte i of 32 holds sub-block j's weight i's fifth bit as bit j
        fifth = ((q >> 4) << np.arange(8, dtype=np.uint8).reshape(8, 1)).sum(axis=-2, dtype=np.uint8)  # [R, S, 32]
        packed = np.concatenate([packed, fifth], axis=-1)
    return np.concatenate([halves, packed, nibbles.reshape(rows, k // 256, 128)], axis=-1).reshape(rows, -1)


def q5_k_bytes(values: np.ndarray) -> np.ndarray:
    """Q5_K blocks uint8 [rows, K/256 * 176] of values [rows, K]: as `q4_k_bytes` with q in 0..31."""
    return q4_k_bytes(values, top=31)


def q6_k_bytes(values: np.ndarray) -> np.ndarray:
    """Q6_K blocks uint8 [rows, K/256 * 210] of values [rows, K]: per 16, q in -32..31 times an int8
    multiple of the super-block's float16 d."""
    rows, k = values.shape
    x = values.reshape(rows, k // 256, 16, 16)
    scale = np.abs(x).max(-1) / 31                                                    # [R, S, 16]
    d = (np.maximum(scale.max(-1), 1e-8) / 127).astype(np.float16)                    # [R, S]
    sc = np.clip(np.rint(scale / d[..., None].astype(np.float32)), -128, 127).astype(np.int8)
    step = d[..., None].astype(np.float32) * sc
    q = (np.clip(np.rint(x / np.where(step != 0, step, 1)[..., None]), -32, 31) + 32).astype(np.uint8)
    q = q.reshape(rows, k // 256, 2, 128)                                             # two halves of 128
    low, high = q & 0x0F, (q >> 4).reshape(rows, k // 256, 2, 4, 32)
    ql = low[..., :64] | (low[..., 64:] << 4)                                        # [R, S, 2, 64]
    qh = high[..., 0, :] | (high[..., 1, :] << 2) | (high[..., 2, :] << 4) | (high[..., 3, :] << 6)
    return np.concatenate([ql.reshape(rows, -1, 128), qh.reshape(rows, -1, 64), sc.view(np.uint8),
                           d[..., None].view(np.uint8)], axis=-1).reshape(rows, -1)


def _more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's use_more_bits: the first and last eighth of the layers, and every third between."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def gguf_type(name: str, dims: tuple[int, ...], layers: int, mix: str, tied: bool):
    """The GGML type of parameter `name` in a file of `mix` ("q4_0", "q4_k_m" or "q5_k_m")."""
    import gguf

    kinds = gguf.GGMLQuantizationType
    if len(dims) == 1:
        return kinds.F32
    output = "lm_head" in name or ("embed" in name and tied)
    if mix == "q4_0":
        return kinds.Q8_0 if "embed" in name or "lm_head" in name else kinds.Q4_0
    layer = int(name.split(".")[2]) if name.startswith("model.layers.") else -1
    wide = output or (("v_proj" in name or "down_proj" in name) and _more_bits(layer, layers))
    return kinds.Q6_K if wide else kinds.Q5_K if mix == "q5_k_m" else kinds.Q4_K


def _quantized(values: np.ndarray, kind) -> np.ndarray:
    import gguf

    own = {gguf.GGMLQuantizationType.Q4_K: q4_k_bytes, gguf.GGMLQuantizationType.Q5_K: q5_k_bytes,
           gguf.GGMLQuantizationType.Q6_K: q6_k_bytes}
    return own[kind](values) if kind in own else gguf.quants.quantize(values, kind)


def write_gguf(path: Path, config, params: list[tuple[str, tuple[int, ...]]], seed: int = 0,
               mix: str = "q4_0") -> int:
    """The checkpoint as a GGUF file (see the module docstring), tensors generated one at a time."""
    import gguf

    arch = {"qwen2": "qwen2", "llama": "llama"}[config.model_type]
    names = gguf.get_tensor_name_map(next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch),
                                     config.num_hidden_layers)
    writer = gguf.GGUFWriter(path, arch)
    writer.add_name(path.stem)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(float(getattr(config, "rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    tokens = _token_list(config.vocab_size)
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL] * 2 + [gguf.TokenType.NORMAL] * (len(tokens) - 2))
    writer.add_token_merges(["Ġ Ġ"])  # one merge (two spaces): transformers' reader wants merges
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    writer.add_chat_template(TEMPLATE)
    plan = []
    for name, dims in params:
        stem, suffix = name.rsplit(".", 1)
        kind = gguf_type(name, dims, config.num_hidden_layers, mix, config.tie_word_embeddings)
        nbytes = int(np.prod(gguf.quant_shape_to_byte_shape(dims, kind))) if len(dims) > 1 else 4 * int(np.prod(dims))
        writer.add_tensor_info(f"{names.get_name(stem)}.{suffix}", dims, np.dtype(np.float32), nbytes,
                               None if len(dims) == 1 else kind)
        plan.append((name, dims, kind))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for name, dims, kind in plan:
        values = np.ones(dims, np.float32) if name.endswith("norm.weight") else \
            rng.normal(0.0, 0.02, dims).astype(np.float32)
        writer.write_tensor_data(values if kind == gguf.GGMLQuantizationType.F32 else _quantized(values, kind))
        del values
    writer.close()
    return path.stat().st_size


def _token_list(vocab_size: int) -> list[str]:
    from tokenizers import pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokens = ["<s>", "</s>", *alphabet, "ĠĠ"]
    return tokens + [f"<w{i}>" for i in range(len(tokens), vocab_size)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shape", nargs="?", choices=sorted(SHAPES))
    parser.add_argument("-o", "--output", type=Path)
    parser.add_argument("--list", action="store_true", help="list the shapes and their parameter counts")
    parser.add_argument("--gguf", nargs="?", const="q4_0", choices=GGUF_MIXES, metavar="MIX",
                        help="write a GGUF file (-o names it): q4_0 (the default), q4_k_m or q5_k_m")
    parser.add_argument("--tokenizer-from", type=Path, metavar="PATH",
                        help="a real model's tokenizer (a .gguf file or a Hugging Face directory) instead of "
                             "the byte-level one (safetensors checkpoints only)")
    args = parser.parse_args()
    if args.list or not args.shape:
        for name in sorted(SHAPES):
            _, params = parameters(SHAPES[name])
            print(f"{name:14s} {sum(int(np.prod(d)) for _, d in params) / 1e9:.2f}B parameters")
        return
    config, params = parameters(SHAPES[args.shape])
    if args.tokenizer_from and not args.tokenizer_from.exists():
        parser.error(f"--tokenizer-from {args.tokenizer_from}: no such file or directory")
    if args.gguf and args.tokenizer_from:
        parser.error("--tokenizer-from applies to safetensors checkpoints; the GGUF carries the byte-level vocabulary")
    if args.gguf:
        out = args.output or Path("models") / f"{args.shape}-random-{args.gguf}.gguf"
        out.parent.mkdir(parents=True, exist_ok=True)
        written = write_gguf(out, config, params, mix=args.gguf)
        print(f"{out}: {sum(int(np.prod(d)) for _, d in params) / 1e9:.2f}B parameters, {written / 2**30:.2f} GiB")
        return
    out = args.output or Path("models") / f"{args.shape}-random"
    out.mkdir(parents=True, exist_ok=True)
    config.dtype = "bfloat16"
    if args.tokenizer_from:
        copy_tokenizer(args.tokenizer_from, out, config)
    else:
        write_tokenizer(out, config.vocab_size)
    config.save_pretrained(out)
    written = write_safetensors(out / "model.safetensors", params)
    print(f"{out}: {sum(int(np.prod(d)) for _, d in params) / 1e9:.2f}B parameters, {written / 2**30:.2f} GiB of bf16")


if __name__ == "__main__":
    sys.exit(main())
