#!/usr/bin/env python3
"""Writes a Hugging Face Llama model directory with random bf16 weights for a named shape, for
GPU benchmarks (turbokv and the PyTorch baseline in bench/cuda/e2e_bench.py read it alike).

  attn4      4 layers, hidden 4096, 32 query / 8 KV heads, head_dim 128, FFN 1024, vocab 8192
  llama3-8b  32 layers, hidden 4096, 32 / 8 heads, head_dim 128, FFN 14336, vocab 128256
  tinycode   6 layers, hidden 512, 4 / 2 heads, head_dim 128, FFN 1408, vocab 8192 (the shipped
             model's sizes with random weights and this script's RoPE base and untied
             LM head: GPU-vs-CPU tests where the real weights are not at hand)

usage: scripts/make_shape_model.py NAME OUT_DIR [--seed S] [--max-position N] [--weights mlx4]

--weights mlx4 writes the same random weights (same seed) quantized to MLX affine 4-bit groups
of 64 (uint32 codes, bf16 scales and biases, embedding and lm_head included, as mlx-community's
"-4bit" checkpoints are), for the 4-bit vs bf16 decode comparison; the quantization runs on
the GPU when there is one.

Needs PyTorch and safetensors (the GPU machine's Python has both); tensors are drawn on the
GPU when there is one. The tokenizer is the shipped model's (vocab 8192): token ids past it
are only ever fed by benchmarks, never decoded. Weights ~ N(0, 0.02), norms 1, as Llama's
initializer, so activations stay in a realistic range.
"""
import argparse
import json
import os
import shutil
import sys

SHAPES = {
    "attn4": dict(num_hidden_layers=4, hidden_size=4096, num_attention_heads=32,
                  num_key_value_heads=8, head_dim=128, intermediate_size=1024, vocab_size=8192),
    "llama3-8b": dict(num_hidden_layers=32, hidden_size=4096, num_attention_heads=32,
                      num_key_value_heads=8, head_dim=128, intermediate_size=14336,
                      vocab_size=128256),
    "tinycode": dict(num_hidden_layers=6, hidden_size=512, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=128, intermediate_size=1408, vocab_size=8192),
}

SHARD_BYTES = 4 << 30


def quantize_mlx4(torch, w, group=64):
    """MLX affine 4-bit quantization of a [rows, cols] matrix, as mlx.core.quantize does:
    per group of 64 inputs scale = (max - min) / 15 and bias = min (both rounded to bf16),
    q = round((w - bias) / scale) in 0..15, packed 8 per uint32 word, LSB first. Returns the
    codes [rows, cols / 8] (as int32, the same bits), scales and biases [rows, cols / 64]."""
    rows, cols = w.shape
    x = w.float().reshape(rows, cols // group, group)
    lo, hi = x.amin(dim=2), x.amax(dim=2)
    scale = ((hi - lo) / 15.0).to(torch.bfloat16)
    bias = lo.to(torch.bfloat16)
    s = scale.float().clamp_min(1e-12).unsqueeze(2)
    q = torch.round((x - bias.float().unsqueeze(2)) / s).clamp(0, 15).to(torch.int64)
    q = q.reshape(rows, cols // 8, 8)
    words = torch.zeros(rows, cols // 8, dtype=torch.int64, device=w.device)
    for j in range(8):
        words |= q[:, :, j] << (4 * j)
    words = torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)
    return words, scale, bias


def write_safetensors(path, tensors, torch):
    """A safetensors file of the tensors (int32 tensors are written as U32: MLX codes)."""
    names = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32",
             torch.int32: "U32"}
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        for t in tensors.values():
            t = t.contiguous().cpu()
            if t.dtype in (torch.bfloat16, torch.float16):
                t = t.view(torch.int16)
            f.write(t.numpy().tobytes())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=sorted(SHAPES))
    parser.add_argument("out")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-position", type=int, default=1 << 22,
                        help="max_position_embeddings (long-context benchmarks need room)")
    parser.add_argument("--weights", choices=["bf16", "mlx4"], default="bf16",
                        help="bf16 matrices, or MLX affine 4-bit groups of 64")
    args = parser.parse_args()
    try:
        import torch
    except ImportError as e:
        sys.exit(f"make_shape_model.py needs torch: {e}")

    shape = SHAPES[args.name]
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "mlp_bias": False,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"},
        "tie_word_embeddings": False,
        "max_position_embeddings": args.max_position,
        "bos_token_id": 8189,
        "eos_token_id": 8189,
        "dtype": "bfloat16",
        **shape,
    }
    if args.weights == "mlx4":
        config["quantization"] = {"group_size": 64, "bits": 4}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(args.out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 8189, "eos_token_id": 8189}, f)
    here = os.path.dirname(os.path.abspath(__file__))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(here, "..", "models", "tinycode-llama", name), args.out)

    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=device).manual_seed(args.seed)
    H, I, V = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"]
    q_dim = shape["num_attention_heads"] * shape["head_dim"]
    kv_dim = shape["num_key_value_heads"] * shape["head_dim"]

    def normal(*dims):
        return (torch.randn(*dims, generator=gen, device=device) * 0.02).to(torch.bfloat16)

    def ones(n):
        return torch.ones(n, dtype=torch.bfloat16, device=device)

    tensors = {"model.embed_tokens.weight": normal(V, H), "model.norm.weight": ones(H),
               "lm_head.weight": normal(V, H)}
    for l in range(shape["num_hidden_layers"]):
        p = f"model.layers.{l}."
        tensors.update({
            p + "input_layernorm.weight": ones(H),
            p + "post_attention_layernorm.weight": ones(H),
            p + "self_attn.q_proj.weight": normal(q_dim, H),
            p + "self_attn.k_proj.weight": normal(kv_dim, H),
            p + "self_attn.v_proj.weight": normal(kv_dim, H),
            p + "self_attn.o_proj.weight": normal(H, q_dim),
            p + "mlp.gate_proj.weight": normal(I, H),
            p + "mlp.up_proj.weight": normal(I, H),
            p + "mlp.down_proj.weight": normal(H, I),
        })

    if args.weights == "mlx4":
        quantized = {}
        for name, t in tensors.items():
            if t.dim() == 2:
                base = name[:-len(".weight")]
                codes, scales, biases = quantize_mlx4(torch, t)
                quantized.update({name: codes, base + ".scales": scales, base + ".biases": biases})
            else:
                quantized[name] = t
        tensors = quantized

    # Shards of at most SHARD_BYTES, with the index transformers writes.
    shards, current, size = [], {}, 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if current and size + nbytes > SHARD_BYTES:
            shards.append(current)
            current, size = {}, 0
        current[name] = t
        size += nbytes
    shards.append(current)
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        write_safetensors(os.path.join(args.out, file), shard, torch)
        for k, v in shard.items():
            weight_map[k] = file
            total += v.numel() * v.element_size()
    with open(os.path.join(args.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    print(f"{args.name} ({args.weights}): {total / 2**30:.2f} GiB in {len(shards)} shard(s) -> "
          f"{args.out}")


if __name__ == "__main__":
    main()
