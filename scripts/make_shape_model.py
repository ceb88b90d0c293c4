#!/usr/bin/env python3
"""Writes a Hugging Face Llama model directory with random bf16 weights for a named shape, for
GPU benchmarks (turbokv and the PyTorch baseline in bench/cuda/e2e_bench.py read it alike).

  attn4      4 layers, hidden 4096, 32 query / 8 KV heads, head_dim 128, FFN 1024, vocab 8192
  llama3-8b  32 layers, hidden 4096, 32 / 8 heads, head_dim 128, FFN 14336, vocab 128256

usage: scripts/make_shape_model.py NAME OUT_DIR [--seed S] [--max-position N]

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
}

SHARD_BYTES = 4 << 30


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=sorted(SHAPES))
    parser.add_argument("out")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-position", type=int, default=1 << 22,
                        help="max_position_embeddings (long-context benchmarks need room)")
    args = parser.parse_args()
    try:
        import torch
        from safetensors.torch import save_file
    except ImportError as e:
        sys.exit(f"make_shape_model.py needs torch and safetensors: {e}")

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
        save_file({k: v.cpu().contiguous() for k, v in shard.items()},
                  os.path.join(args.out, file), metadata={"format": "pt"})
        for k, v in shard.items():
            weight_map[k] = file
            total += v.numel() * v.element_size()
    with open(os.path.join(args.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    print(f"{args.name}: {sum(t.numel() for t in tensors.values()) / 1e9:.2f} B parameters, "
          f"{total / 2**30:.1f} GiB in {len(shards)} shard(s) -> {args.out}")


if __name__ == "__main__":
    main()
