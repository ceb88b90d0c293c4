#!/usr/bin/env python3
"""Cuts the small real q/k/v fixture of the attention tests out of a q/k/v dump.

The dump (tinycode-llama-qkv.safetensors: post-RoPE layer{i}.q [4, 1024, 128] and layer{i}.k,
layer{i}.v [2, 1024, 128], fp16, of the shipped model on 1024 tokens) is not in the repository;
tests/fixtures/tinycode-llama-qkv-slice.safetensors is this script's output:

    scripts/slice_qkv_fixture.py DUMP tests/fixtures/tinycode-llama-qkv-slice.safetensors

It keeps layers 1 and 4, the keys and values of the first 640 tokens and the queries of
positions 600..639 (fp16 as in the dump). Standard library only.
"""
import json
import struct
import sys

LAYERS = (1, 4)
TOKENS = 640
Q_FIRST = 600


def main(src, dst):
    with open(src, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        base = 8 + n

        def rows(name, first, count):
            meta = header[name]
            if meta["dtype"] != "F16":
                raise SystemExit(f"{name}: dtype {meta['dtype']}, expected F16")
            heads, tokens, dim = meta["shape"]
            begin = meta["data_offsets"][0]
            out = bytearray()
            for h in range(heads):
                f.seek(base + begin + (h * tokens + first) * dim * 2)
                out += f.read(count * dim * 2)
            return [heads, count, dim], bytes(out)

        tensors = {}
        for layer in LAYERS:
            tensors[f"layer{layer}.k"] = rows(f"layer{layer}.k", 0, TOKENS)
            tensors[f"layer{layer}.v"] = rows(f"layer{layer}.v", 0, TOKENS)
            tensors[f"layer{layer}.q"] = rows(f"layer{layer}.q", Q_FIRST, TOKENS - Q_FIRST)

    out_header = {"__metadata__": {"tokens": str(TOKENS), "q_first_pos": str(Q_FIRST)}}
    offset = 0
    for name, (shape, data) in tensors.items():
        out_header[name] = {"dtype": "F16", "shape": shape,
                            "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    blob = json.dumps(out_header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(dst, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for _, data in tensors.values():
            f.write(data)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: slice_qkv_fixture.py DUMP OUT")
    main(sys.argv[1], sys.argv[2])
