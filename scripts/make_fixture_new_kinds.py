#!/usr/bin/env python3
"""Makes the hf-tiny fixtures of features no stored fixture covers, with transformers 5.17
(run on a machine that has it; torch on CPU is enough):

  gemma4_text_k_eq_v : gemma4_text whose global layers use attention_k_eq_v (no v_proj, V from
                       the keys) with their own KV head count and head_dim
  qwen3_5_moe_text   : Qwen3.5 with the sparse MLP (routed experts plus a shared expert)

Each directory gets config.json, generation_config.json, model.safetensors (fp32 random
weights, initializer_range 0.1) and reference.safetensors holding input_ids [24] (seeded),
logits [24, vocab] (fp32) and generated [8] (greedy new tokens), the layout the golden tests
read. Copy the directories into tests/fixtures/hf-tiny/ and add their names to the golden test.

Each fixture is made on its own: one the installed transformers cannot build is reported (with
its traceback) and the other is still written; the exit status is 1 if any failed. After
building each model the script checks that the features it is for are really there (no v_proj
on keys-equal-values layers, routed and shared experts on the MoE layers) and prints the
structure it checked, so a silently ignored config field cannot pass.

Usage: scripts/make_fixture_new_kinds.py OUT_DIR
"""
import os
import sys
import traceback

import torch
import transformers
from safetensors.torch import save_file


def tiny_gemma4_k_eq_v():
    layer_types = ["sliding_attention", "sliding_attention", "full_attention"] * 2
    config = transformers.Gemma4TextConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, attention_k_eq_v=True,
        # The constructor turns these into per_layer_config for the full-attention layers.
        global_head_dim=32, num_global_key_value_heads=1, layer_types=layer_types,
        sliding_window=8, num_kv_shared_layers=2, hidden_size_per_layer_input=16,
        vocab_size_per_layer_input=512, max_position_embeddings=256, initializer_range=0.1,
        rope_parameters={
            "full_attention": {"rope_type": "proportional", "rope_theta": 1e6,
                               "partial_rotary_factor": 0.25},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        },
        bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = transformers.Gemma4ForCausalLM(config)
    for i, layer in enumerate(model.model.layers):
        attn = layer.self_attn
        proj = {n: tuple(getattr(attn, n).weight.shape) for n in ("q_proj", "k_proj", "v_proj")
                if getattr(attn, n, None) is not None}
        print(f"  gemma4 layer {i} ({layer_types[i]}): {proj}")
    global_attn = model.model.layers[2].self_attn
    if getattr(global_attn, "v_proj", None) is not None:
        raise RuntimeError("attention_k_eq_v was not applied: global layer 2 has a v_proj")
    if tuple(global_attn.k_proj.weight.shape) != (32, 64):
        raise RuntimeError(f"global layer 2 k_proj is {tuple(global_attn.k_proj.weight.shape)}, "
                           "not 1 KV head of 32")
    return model


def tiny_qwen3_5_moe():
    config = transformers.Qwen3_5MoeTextConfig(
        vocab_size=512, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, layer_types=["linear_attention"] * 3 +
        ["full_attention"], linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, max_position_embeddings=256,
        initializer_range=0.1, rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                                "partial_rotary_factor": 0.25},
        bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = transformers.Qwen3_5MoeForCausalLM(config)
    mlp = model.model.layers[0].mlp
    print(f"  qwen3_5_moe layer 0 mlp: {type(mlp).__name__}: "
          f"{[n for n, _ in mlp.named_children()]}")
    names = [n for n, _ in model.named_parameters()]
    if not any("shared_expert" in n for n in names) or not any("experts" in n for n in names):
        raise RuntimeError("the MoE fixture has no routed or no shared experts")
    return model


def write(model, out):
    os.makedirs(out, exist_ok=True)
    model = model.float().eval()
    model.save_pretrained(out, safe_serialization=True)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (1, 24), generator=gen)
    with torch.no_grad():
        logits = model(ids).logits[0].float()
        # Greedy by hand (a full forward per token): no end-of-sequence stop, no cache code.
        seq = ids
        for _ in range(8):
            nxt = model(seq).logits[0, -1].argmax().reshape(1, 1)
            seq = torch.cat([seq, nxt], dim=1)
        generated = seq[0, 24:]
    save_file({"input_ids": ids[0].contiguous(), "logits": logits.contiguous(),
               "generated": generated.contiguous()}, os.path.join(out, "reference.safetensors"))
    print(f"wrote {out} (transformers {transformers.__version__})")


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    failed = 0
    for name, make in (("gemma4_text_k_eq_v", tiny_gemma4_k_eq_v),
                       ("qwen3_5_moe_text", tiny_qwen3_5_moe)):
        try:
            torch.manual_seed(0)
            write(make(), os.path.join(sys.argv[1], name))
        except Exception:  # report and go on to the next fixture
            print(f"FAILED {name}:", file=sys.stderr)
            traceback.print_exc()
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
