#!/usr/bin/env python3
"""Writes a config.json with the shape of Qwen3.5-4B's text model (no weights), for
`turbokv bench memory`, which reads only config.json.

Shape, from Qwen3.5-4B's published config.json (text_config): 32 layers, hidden 2560,
intermediate 9216, 16 query / 4 KV heads of head_dim 256, full attention every 4th layer
(layers 3, 7, ..., 31), the other 24 layers Gated DeltaNet with 16 key heads and 32 value heads
of 128 dims and a 4-tap convolution, partial rotary 0.25 with theta 1e7 and mrope sections
[11, 11, 10], vocabulary 248320, 262144 positions.

Usage: scripts/make_qwen3_5_4b_config.py OUT_DIR
"""
import json
import os
import sys


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    layers = 32
    text = {
        "model_type": "qwen3_5_text",
        "architectures": ["Qwen3_5ForCausalLM"],
        "vocab_size": 248320,
        "hidden_size": 2560,
        "intermediate_size": 9216,
        "num_hidden_layers": layers,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "full_attention_interval": 4,
        "layer_types": [
            "full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)
        ],
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "linear_value_head_dim": 128,
        "attn_output_gate": True,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 262144,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000000,
            "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10],
            "mrope_interleaved": True,
        },
        "tie_word_embeddings": True,
        "bos_token_id": None,
        "eos_token_id": 248044,
    }
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(text, f, indent=2)
    print(f"wrote {out}/config.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
