#!/usr/bin/env python3
"""Whole-model decode and prefill on the GPU: turbokv with a dense fp16 cache, TurboQuant 3.5 and
uniform 4 against a plain PyTorch model of the same weights (bf16 matmuls, SDPA over a static
fp16 cache, the decode step captured in a CUDA graph), timed in one process.

usage: bench/cuda/e2e_bench.py --lib build/bench/cuda/libturbokv_e2e_bench.so --model DIR
         [--depths 4096,32768,131072] [--batch 1] [--steps 32] [--kv dense,3.5,4:uniform]
         [--kv-cache-gb 40] [--prefill 4096] [--no-torch] [--max-context] [--out FILE]

KV settings: dense, or BITS[:SCHEME[:ALLOCATION]] ("3.5" is the engine's default TurboQuant
3.5: layer 0 K3/V4, later layers K4/V3, the last layer dense), with "+last" to quantize the
last layer too ("3.5+last").

--max-context: instead, the longest context one sequence fits in the GPU's memory for each KV
setting, each measured by running decode steps at that depth (turbokv only, the whole GPU).
Llama-architecture models only (scripts/make_shape_model.py writes attn4 and llama3-8b).
"""
import argparse
import ctypes
import datetime
import gc
import json
import math
import os
import sys

import torch
import torch.nn.functional as F


def load_lib(path):
    lib = ctypes.CDLL(os.path.abspath(path))
    lib.tkv_e2e_error.restype = ctypes.c_char_p
    lib.tkv_e2e_open.restype = ctypes.c_void_p
    lib.tkv_e2e_open.argtypes = [ctypes.c_char_p, ctypes.c_double]
    lib.tkv_e2e_close.argtypes = [ctypes.c_void_p]
    lib.tkv_e2e_decode.restype = ctypes.c_double
    lib.tkv_e2e_decode.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int,
                                   ctypes.c_longlong, ctypes.c_int, ctypes.c_int,
                                   ctypes.POINTER(ctypes.c_ulonglong)]
    lib.tkv_e2e_prefill.restype = ctypes.c_double
    lib.tkv_e2e_prefill.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
    lib.tkv_e2e_max_depth.restype = ctypes.c_longlong
    lib.tkv_e2e_max_depth.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    return lib


class Engine:
    def __init__(self, lib, model_dir, kv_cache_gb):
        self.lib = lib
        self.h = lib.tkv_e2e_open(model_dir.encode(), kv_cache_gb)
        if not self.h:
            sys.exit(f"turbokv: {lib.tkv_e2e_error().decode()}")

    def check(self, value, what):
        if value < 0:
            sys.exit(f"turbokv {what}: {self.lib.tkv_e2e_error().decode()}")
        return value

    def decode(self, kv, batch, depth, steps):
        out = (ctypes.c_ulonglong * 2)()
        tps = self.check(self.lib.tkv_e2e_decode(self.h, kv.encode(), batch, depth, 3, steps, out),
                         f"decode {kv} batch {batch} depth {depth}")
        return tps, out[0], out[1]

    def prefill(self, kv, tokens):
        return self.check(self.lib.tkv_e2e_prefill(self.h, kv.encode(), tokens), "prefill")

    def max_depth(self, kv):
        return self.check(self.lib.tkv_e2e_max_depth(self.h, kv.encode()), "max depth")

    def close(self):
        self.lib.tkv_e2e_close(self.h)
        self.h = None


class TorchLlama:
    """The straightforward PyTorch decode step of a Llama model: bf16 weights, a static fp16
    K/V cache per layer [batch, kv_heads, max_len, head_dim], SDPA with GQA."""

    def __init__(self, model_dir, batch, max_len):
        from safetensors.torch import load_file
        with open(os.path.join(model_dir, "config.json")) as f:
            c = json.load(f)
        self.c = c
        self.layers = c["num_hidden_layers"]
        self.heads, self.kv_heads = c["num_attention_heads"], c["num_key_value_heads"]
        self.d = c.get("head_dim", c["hidden_size"] // self.heads)
        self.eps = c["rms_norm_eps"]
        w = {}
        index = os.path.join(model_dir, "model.safetensors.index.json")
        files = (sorted(set(json.load(open(index))["weight_map"].values()))
                 if os.path.exists(index) else ["model.safetensors"])
        for f in files:
            w.update({k: v.to("cuda", torch.bfloat16)
                      for k, v in load_file(os.path.join(model_dir, f)).items()})
        self.w = w
        self.lm_head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
        theta = c.get("rope_parameters", {}).get("rope_theta", c.get("rope_theta", 10000.0))
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, self.d, 2, device="cuda").float()
                                         / self.d))
        shape = (batch, self.kv_heads, max_len, self.d)
        self.k = [torch.randn(shape, device="cuda", dtype=torch.float16)
                  for _ in range(self.layers)]
        self.v = [torch.randn(shape, device="cuda", dtype=torch.float16)
                  for _ in range(self.layers)]

    def rms(self, x, weight):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * weight.float()).to(torch.bfloat16)

    def rope(self, x, pos):
        angle = pos * self.inv_freq  # [d / 2]
        cos, sin = torch.cos(angle), torch.sin(angle)
        x1, x2 = x[..., : self.d // 2].float(), x[..., self.d // 2:].float()
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    def step(self, tokens, pos):
        """tokens [batch] at position pos of every sequence -> logits [batch, vocab]."""
        w, B = self.w, tokens.shape[0]
        x = w["model.embed_tokens.weight"][tokens]
        for l in range(self.layers):
            p = f"model.layers.{l}."
            h = self.rms(x, w[p + "input_layernorm.weight"])
            q = (h @ w[p + "self_attn.q_proj.weight"].T).view(B, self.heads, self.d)
            k = (h @ w[p + "self_attn.k_proj.weight"].T).view(B, self.kv_heads, self.d)
            v = (h @ w[p + "self_attn.v_proj.weight"].T).view(B, self.kv_heads, self.d)
            q, k = self.rope(q, pos), self.rope(k, pos)
            self.k[l][:, :, pos] = k.half()
            self.v[l][:, :, pos] = v.half()
            o = F.scaled_dot_product_attention(q.half().unsqueeze(2), self.k[l][:, :, : pos + 1],
                                               self.v[l][:, :, : pos + 1], enable_gqa=True)
            x = x + o.reshape(B, -1).to(torch.bfloat16) @ w[p + "self_attn.o_proj.weight"].T
            h = self.rms(x, w[p + "post_attention_layernorm.weight"])
            g = F.silu(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)
            x = x + g @ w[p + "mlp.down_proj.weight"].T
        return self.rms(x, w["model.norm.weight"]) @ self.lm_head.T

    def decode_tps(self, batch, depth, steps):
        """tok/s of the decode step at `depth` cached tokens, replayed as one CUDA graph."""
        tokens = torch.randint(0, self.c["vocab_size"], (batch,), device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                self.step(tokens, depth)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.step(tokens, depth)
        graph.replay()
        torch.cuda.synchronize()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            graph.replay()
        stop.record()
        stop.synchronize()
        del graph
        return batch * steps / (start.elapsed_time(stop) / 1e3)

    def free(self):
        self.k = self.v = None
        self.w = None
        gc.collect()
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--depths", default="4096,32768,131072")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--kv", default="dense,3.5,4:uniform")
    ap.add_argument("--kv-cache-gb", type=float, default=0)
    ap.add_argument("--prefill", type=int, default=4096, help="prefill prompt tokens (0: skip)")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--max-context", action="store_true")
    ap.add_argument("--out", help="also append the table to this file")
    args = ap.parse_args()
    lib = load_lib(args.lib)
    kvs = args.kv.split(",")
    lines = []

    def emit(line):
        print(line, flush=True)
        lines.append(line)

    props = torch.cuda.get_device_properties(0)
    emit(f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {props.name}, torch "
         f"{torch.__version__}, model {os.path.basename(os.path.normpath(args.model))}")
    if args.max_context:
        engine = Engine(lib, args.model, args.kv_cache_gb)
        emit("kv            max_depth  decode_tok/s_at_it  kv_GB")
        depths = {}
        for kv in kvs:
            depth = engine.max_depth(kv) - 256  # room for the warm-up and timed steps
            tps, kv_bytes, dense = engine.decode(kv, 1, depth, 8)
            depths[kv] = depth
            emit(f"{kv:12s} {depth:10d} {tps:18.1f} {kv_bytes / 1e9:8.2f}")
        if "dense" in depths:
            for kv, d in depths.items():
                if kv != "dense":
                    emit(f"# {kv}: {d / depths['dense']:.2f}x the dense depth")
        engine.close()
    else:
        depths = [int(x) for x in args.depths.split(",")]
        engine = Engine(lib, args.model, args.kv_cache_gb)
        torch_model = None
        if not args.no_torch:
            torch_model = TorchLlama(args.model, args.batch, max(depths) + 1)
        if args.prefill > 0:
            emit(f"prefill {args.prefill} tokens: " + ", ".join(
                f"{kv} {engine.prefill(kv, args.prefill):.0f} tok/s" for kv in kvs))
        header = f"batch  depth  " + "  ".join(f"{kv:>12s}" for kv in kvs)
        header += "  " + "  ".join(f"{kv + '/dense':>14s}" for kv in kvs if kv != "dense")
        if torch_model:
            header += "      torch  dense/torch"
        emit(header + "   (decode tok/s)")
        for depth in depths:
            tps = {kv: engine.decode(kv, args.batch, depth, args.steps)[0] for kv in kvs}
            row = f"{args.batch:5d} {depth:6d}  " + "  ".join(f"{tps[kv]:12.1f}" for kv in kvs)
            if "dense" in tps:
                row += "  " + "  ".join(f"{tps[kv] / tps['dense']:13.2f}x" for kv in kvs
                                        if kv != "dense")
            if torch_model:
                t = torch_model.decode_tps(args.batch, depth, args.steps)
                row += f"  {t:9.1f}  {tps.get('dense', float('nan')) / t:10.2f}x"
            emit(row)
        if torch_model:
            torch_model.free()
        engine.close()
    if args.out:
        with open(args.out, "a") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
