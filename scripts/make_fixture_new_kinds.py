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

Usage: scripts/make_fixture_new_kinds.py OUT_DIR
"""
import os
import sys

import torch
import transformers
from safetensors.torch import save_file


def tiny_gemma4_k_eq_v():
    layer_types = ["sliding_attention", "sliding_attention", "full_attention"] * 2
    config = transformers.Gemma4TextConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
        num_global_key_value_heads=1, attention_k_eq_v=True, layer_types=layer_types,
        sliding_window=8, num_kv_shared_layers=2, hidden_size_per_layer_input=16,
        vocab_size_per_layer_input=512, max_position_embeddings=256, initializer_range=0.1,
        rope_parameters={
            "full_attention": {"rope_type": "proportional", "rope_theta": 1e6,
                               "partial_rotary_factor": 0.25},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        },
        bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return transformers.Gemma4ForCausalLM(config)


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
    return transformers.Qwen3_5MoeForCausalLM(config)


def write(model, out):
    os.makedirs(out, exist_ok=True)
    model = model.float().eval()
    model.save_pretrained(out, safe_serialization=True)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (1, 24), generator=gen)
    with torch.no_grad():
        logits = model(ids).logits[0].float()
        generated = model.generate(ids, max_new_tokens=8, do_sample=False,
                                   eos_token_id=None)[0, 24:]
    save_file({"input_ids": ids[0].contiguous(), "logits": logits.contiguous(),
               "generated": generated.contiguous()}, os.path.join(out, "reference.safetensors"))
    print(f"wrote {out} (transformers {transformers.__version__})")


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    torch.manual_seed(0)
    write(tiny_gemma4_k_eq_v(), os.path.join(sys.argv[1], "gemma4_text_k_eq_v"))
    torch.manual_seed(0)
    write(tiny_qwen3_5_moe(), os.path.join(sys.argv[1], "qwen3_5_moe_text"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
