#!/usr/bin/python3
"""A llama-shaped model with random weights, in several weight formats, for speed benchmarks.

Writes into OUT:
  bf16/            config.json + model.safetensors (bf16 matrices, f32 norms)
  mlx4/            the same weights as MLX affine 4-bit, group 64 (w = scale * q + bias)
  q4_0.gguf        GGUF v3, Q4_0 matrices (q/k rows permuted as llama.cpp's converter does)
  q4_k.gguf        GGUF v3, Q4_K matrices
Every format holds the same random weights (each tensor drawn from its own seed), so decode
speeds compare like for like. Only numpy is needed. The default shape is ~1.1B parameters
(TinyLlama-like: 22 layers, hidden 2048, MLP 5632, 32 heads, 4 KV heads, vocab 32000).

  /usr/bin/python3 scripts/make_random_model.py OUT [--layers 22 --hidden 2048 ...]
  build/turbokv bench e2e --model OUT/bf16 --compare-model OUT/q4_0.gguf \\
      --compare-model OUT/q4_k.gguf --compare-model OUT/mlx4 --threads 2
"""
import argparse
import json
import os
import struct

import numpy as np


def bf16_bits(x):
    u = x.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_round(x):
    return (bf16_bits(x).astype(np.uint32) << 16).view(np.float32)


def quant_q4_0(w):
    """[rows, cols] f32 -> Q4_0 blocks: f16 d, 16 bytes of nibbles (value j low, j + 16 high)."""
    x = w.reshape(-1, 32)
    idx = np.argmax(np.abs(x), axis=1)
    mx = x[np.arange(len(x)), idx]
    d = mx / -8.0
    inv = np.where(d != 0, 1.0 / np.where(d != 0, d, 1), 0)
    q = np.clip(np.floor(x * inv[:, None] + 8.5), 0, 15).astype(np.uint8)
    out = np.empty((len(x), 18), np.uint8)
    out[:, 0:2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q[:, :16] | (q[:, 16:] << 4)
    return out.tobytes()


def quant_q4_k(w):
    """[rows, cols] f32 -> Q4_K super-blocks of 256 (plain min/max per sub-block of 32)."""
    x = w.reshape(-1, 8, 32)
    lo = np.minimum(x.min(axis=2), 0)
    hi = x.max(axis=2)
    scale = (hi - lo) / 15.0
    d = scale.max(axis=1) / 63.0
    dmin = (-lo).max(axis=1) / 63.0
    d16 = d.astype(np.float16).astype(np.float32)
    dmin16 = dmin.astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(scale / np.where(d16 > 0, d16, 1)[:, None]), 0, 63).astype(np.int32)
    mn = np.clip(np.round(-lo / np.where(dmin16 > 0, dmin16, 1)[:, None]), 0, 63).astype(np.int32)
    step = (d16[:, None] * sc)[:, :, None]
    off = (dmin16[:, None] * mn)[:, :, None]
    q = np.clip(np.round((x + off) / np.where(step > 0, step, 1)), 0, 15).astype(np.uint8)
    q = q.reshape(-1, 256)
    n = len(q)
    s = np.zeros((n, 12), np.uint8)
    for j in range(4):
        s[:, j] = (sc[:, j] & 63) | ((sc[:, j + 4] >> 4) << 6)
        s[:, j + 4] = (mn[:, j] & 63) | ((mn[:, j + 4] >> 4) << 6)
        s[:, j + 8] = (sc[:, j + 4] & 0xF) | ((mn[:, j + 4] & 0xF) << 4)
    qs = np.empty((n, 128), np.uint8)
    for c in range(4):
        qs[:, 32 * c:32 * c + 32] = q[:, 64 * c:64 * c + 32] | (q[:, 64 * c + 32:64 * c + 64] << 4)
    out = np.empty((n, 144), np.uint8)
    out[:, 0:2] = d16.astype(np.float16).view(np.uint8).reshape(-1, 2)
    out[:, 2:4] = dmin16.astype(np.float16).view(np.uint8).reshape(-1, 2)
    out[:, 4:16] = s
    out[:, 16:] = qs
    return out.tobytes()


def quant_mlx4(w, group=64):
    """[rows, cols] f32 -> (uint32 codes [rows, cols / 8], bf16 scales, bf16 biases)."""
    rows, cols = w.shape
    x = w.reshape(rows, cols // group, group)
    lo, hi = x.min(axis=2), x.max(axis=2)
    scale = bf16_round((hi - lo) / 15.0)
    bias = bf16_round(lo)
    q = np.clip(np.round((x - bias[:, :, None]) / np.where(scale > 0, scale, 1)[:, :, None]), 0, 15)
    q = q.astype(np.uint32).reshape(rows, cols // 8, 8)
    words = np.zeros((rows, cols // 8), np.uint32)
    for j in range(8):
        words |= q[:, :, j] << np.uint32(4 * j)
    return words.tobytes(), bf16_bits(scale).tobytes(), bf16_bits(bias).tobytes()


def permute(w, heads):
    rows = w.shape[0]
    return w.reshape(heads, 2, rows // heads // 2, -1).swapaxes(1, 2).reshape(w.shape)


class Gguf:
    def __init__(self, path, kv, tensors, block):
        """tensors: [(name, ne, type, nbytes)] in write order."""
        self.f = open(path, "wb")
        out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv)))
        for key, (kind, value) in kv.items():
            out += struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", kind)
            if kind == 8:
                out += struct.pack("<Q", len(value)) + value.encode()
            else:
                out += struct.pack({4: "<I", 6: "<f"}[kind], value)
        offset = 0
        self.offsets = []
        for name, ne, ttype, nbytes in tensors:
            out += struct.pack("<Q", len(name)) + name.encode() + struct.pack("<I", len(ne))
            out += struct.pack("<%dQ" % len(ne), *ne) + struct.pack("<IQ", ttype, offset)
            self.offsets.append(offset)
            offset = (offset + nbytes + 31) // 32 * 32
        out += b"\0" * ((32 - len(out) % 32) % 32)
        self.f.write(out)
        self.start = len(out)

    def write(self, index, data):
        self.f.seek(self.start + self.offsets[index])
        self.f.write(data)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=22)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=5632)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    H, I, V, hd = a.hidden, a.intermediate, a.vocab, a.hidden // a.heads
    if H % 256 or I % 256:
        raise SystemExit("hidden and intermediate sizes must be multiples of 256 (Q4_K blocks)")

    # (HF name, GGUF name, shape [rows, cols] or [n], heads of the q/k permutation or 0)
    tensors = [("model.embed_tokens.weight", "token_embd.weight", (V, H), 0)]
    for l in range(a.layers):
        p, g = f"model.layers.{l}.", f"blk.{l}."
        tensors += [
            (p + "input_layernorm.weight", g + "attn_norm.weight", (H,), 0),
            (p + "self_attn.q_proj.weight", g + "attn_q.weight", (a.heads * hd, H), a.heads),
            (p + "self_attn.k_proj.weight", g + "attn_k.weight", (a.kv_heads * hd, H), a.kv_heads),
            (p + "self_attn.v_proj.weight", g + "attn_v.weight", (a.kv_heads * hd, H), 0),
            (p + "self_attn.o_proj.weight", g + "attn_output.weight", (H, a.heads * hd), 0),
            (p + "post_attention_layernorm.weight", g + "ffn_norm.weight", (H,), 0),
            (p + "mlp.gate_proj.weight", g + "ffn_gate.weight", (I, H), 0),
            (p + "mlp.up_proj.weight", g + "ffn_up.weight", (I, H), 0),
            (p + "mlp.down_proj.weight", g + "ffn_down.weight", (H, I), 0),
        ]
    tensors += [("model.norm.weight", "output_norm.weight", (H,), 0),
                ("lm_head.weight", "output.weight", (V, H), 0)]

    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H,
              "intermediate_size": I, "num_hidden_layers": a.layers,
              "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads, "head_dim": hd,
              "vocab_size": V, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
              "rope_theta": 10000.0, "tie_word_embeddings": False, "hidden_act": "silu",
              "bos_token_id": 1, "eos_token_id": 2}
    os.makedirs(os.path.join(a.out, "bf16"), exist_ok=True)
    os.makedirs(os.path.join(a.out, "mlx4"), exist_ok=True)
    with open(os.path.join(a.out, "bf16", "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    with open(os.path.join(a.out, "mlx4", "config.json"), "w") as f:
        json.dump(dict(config, quantization={"group_size": 64, "bits": 4}), f, indent=1)

    def safetensors(path, entries):
        header, offset = {}, 0
        for name, dtype, shape, nbytes in entries:
            header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
        text = json.dumps(header).encode()
        text += b" " * ((8 - len(text) % 8) % 8)
        f = open(path, "wb")
        f.write(struct.pack("<Q", len(text)) + text)
        return f

    bf16_entries, mlx_entries, q40, q4k = [], [], [], []
    for hf, gg, shape, _ in tensors:
        n = int(np.prod(shape))
        if len(shape) == 1:
            bf16_entries.append((hf, "F32", shape, 4 * n))
            mlx_entries.append((hf, "F32", shape, 4 * n))
            q40.append((gg, [shape[0]], 0, 4 * n))
            q4k.append((gg, [shape[0]], 0, 4 * n))
            continue
        rows, cols = shape
        bf16_entries.append((hf, "BF16", shape, 2 * n))
        base = hf[:-len(".weight")]
        mlx_entries += [(hf, "U32", (rows, cols // 8), n // 2),
                        (base + ".scales", "BF16", (rows, cols // 64), 2 * n // 64),
                        (base + ".biases", "BF16", (rows, cols // 64), 2 * n // 64)]
        q40.append((gg, [cols, rows], 2, n // 32 * 18))
        q4k.append((gg, [cols, rows], 12, n // 256 * 144))
    kv = {"general.architecture": (8, "llama"), "llama.embedding_length": (4, H),
          "llama.block_count": (4, a.layers), "llama.feed_forward_length": (4, I),
          "llama.attention.head_count": (4, a.heads), "llama.attention.head_count_kv": (4, a.kv_heads),
          "llama.context_length": (4, 4096), "llama.vocab_size": (4, V),
          "llama.rope.freq_base": (6, 10000.0), "llama.attention.layer_norm_rms_epsilon": (6, 1e-5)}
    f_bf16 = safetensors(os.path.join(a.out, "bf16", "model.safetensors"), bf16_entries)
    f_mlx = safetensors(os.path.join(a.out, "mlx4", "model.safetensors"), mlx_entries)
    g40 = Gguf(os.path.join(a.out, "q4_0.gguf"), kv, q40, 32)
    g4k = Gguf(os.path.join(a.out, "q4_k.gguf"), kv, q4k, 256)
    for i, (hf, gg, shape, heads) in enumerate(tensors):
        rng = np.random.default_rng([a.seed, i])
        if len(shape) == 1:
            w = (1.0 + 0.1 * rng.standard_normal(shape, np.float32)).astype(np.float32)
            for f in (f_bf16, f_mlx):
                f.write(w.tobytes())
            g40.write(i, w.tobytes())
            g4k.write(i, w.tobytes())
            continue
        w = bf16_round(0.02 * rng.standard_normal(shape, np.float32))
        f_bf16.write(bf16_bits(w).tobytes())
        codes, scales, biases = quant_mlx4(w)
        f_mlx.write(codes)
        f_mlx.write(scales)
        f_mlx.write(biases)
        wg = permute(w, heads) if heads else w
        g40.write(i, quant_q4_0(wg))
        g4k.write(i, quant_q4_k(wg))
        print(f"{i + 1}/{len(tensors)} {hf} {shape}", flush=True)
    for f in (f_bf16, f_mlx, g40.f, g4k.f):
        f.close()


if __name__ == "__main__":
    main()
