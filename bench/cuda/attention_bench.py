#!/usr/bin/env python3
"""Decode attention on an H200: TurboQuant 3.5 (ours) vs our dense fp16 kernel vs PyTorch SDPA.

One process: PyTorch owns the data, our kernels run from libturbokv_cuda_bench.so (ctypes).
Shape: 32 query / 8 KV heads, d = 128, one decode query per sequence, fp16 K/V for the dense
kernels. Every method is timed the same way: CUDA-graph replays of `calls` back-to-back calls
that cycle over enough copies of the cache that it is read from HBM (>= 256 MB touched per
cycle), median of `reps` replays; the methods' replays are interleaved round by round, so a
clock that drifts during the run (the GPU warming up) does not favour the one timed first. Also measures device-to-device copy bandwidth (read + write
bytes) in the same run. Bytes read: TurboQuant 116 B per token per KV head, fp16 512 B.
TurboQuant is timed twice: plain launches (tq35_us, the columns after it) and with
programmatic dependent launch (pdl_us: each call's prologue may overlap the previous call's
end, as it would overlap the previous kernel of a decode step in an engine that enables PDL;
SDPA and our dense kernel are launched plainly). Both must give the same output.

usage: attention_bench.py --lib build/bench/cuda/libturbokv_cuda_bench.so [--cases 1:4096,16:32768]
       [--variant NAME=OTHER_BUILD.so ...] [--timeline]
"""
import argparse
import ctypes
import datetime
import math
import sys

import torch
import torch.nn.functional as F

N_HEADS, KV_HEADS, D = 32, 8, 128
TQ_BYTES_PER_TOKEN_HEAD = 116
F16_BYTES_PER_TOKEN_HEAD = 2 * 2 * D
MIN_TOUCHED = 256 << 20
CALLS, REPS = 20, 21


def load_lib(path):
    lib = ctypes.CDLL(path)
    P, I, S, F32, U64, D64 = (ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_float,
                              ctypes.c_uint64, ctypes.c_double)
    lib.tkv_last_error.restype = ctypes.c_char_p
    lib.tkv_tq_tile_bytes.restype = I
    lib.tkv_tq_quantize.restype = D64
    lib.tkv_tq_quantize.argtypes = [P, P, P, I, I, I, I, U64]
    lib.tkv_tq_graph.restype = P
    lib.tkv_tq_graph.argtypes = [P, I, I, S, P, I, P, I, I, I, F32, P, U64, I, I]
    lib.tkv_dense_graph.restype = P
    lib.tkv_dense_graph.argtypes = [P, I, I, S, P, I, P, I, I, I, F32, P, I]
    lib.tkv_graph_us.restype = D64
    lib.tkv_graph_us.argtypes = [P]
    lib.tkv_graph_free.argtypes = [P]
    lib.tkv_tq_timeline.restype = D64
    lib.tkv_tq_timeline.argtypes = [P, I, P, I, P, I, I, I, F32, P, U64, I, I, P]
    return lib


def check(lib, value, what):
    if value < 0:
        sys.exit(f"{what} failed: {lib.tkv_last_error().decode()}")
    return value


def torch_graph_timer(fn, calls=CALLS):
    """Captures `fn(i)` for i < calls in one CUDA graph; returns a function that replays it
    once and gives µs per call."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn(0)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for i in range(calls):
                fn(i)
        graph.replay()
    torch.cuda.synchronize()

    def once():
        with torch.cuda.stream(stream):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            stop.record()
            stop.synchronize()
        return 1000.0 * start.elapsed_time(stop) / calls
    return once, graph


def lib_graph_timer(lib, handle, what):
    if not handle:
        sys.exit(f"{what} failed: {lib.tkv_last_error().decode()}")
    return lambda: check(lib, lib.tkv_graph_us(handle), what)


def time_interleaved(timers, reps=REPS):
    """Median µs per call of each timer, replayed in turn (one replay each per round, the
    order rotated every round), so slow drifts such as clock changes hit every method alike."""
    names = list(timers)
    times = {n: [] for n in names}
    for r in range(reps):
        for i in range(len(names)):
            n = names[(i + r) % len(names)]
            times[n].append(timers[n]())
    return {n: sorted(t)[len(t) // 2] for n, t in times.items()}


def copy_bandwidth():
    """Device-to-device copy of 4 GiB (cudaMemcpyAsync through torch), read + write bytes."""
    n = 4 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    for _ in range(2):
        dst.copy_(src)
    times = []
    for _ in range(10):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    del src, dst
    torch.cuda.empty_cache()
    return 2 * n / (times[len(times) // 2] * 1e-3) / 1e9


def n_blocks_of(ctx):
    """256-token cache blocks of a sequence of ctx tokens."""
    return (ctx + 255) // 256


def quantize_sequences(lib, tiles, batch, ctx, seed, kv_of):
    """Quantizes sequence b's K and V, kv_of(b) = (k, v) as [ctx, kv_heads, D] (any float
    dtype), into its paged blocks tiles[b * per_seq:] with the library's TurboQuant 3.5 kernel."""
    n_blocks = n_blocks_of(ctx)
    per_seq = n_blocks * KV_HEADS * 8 * lib.tkv_tq_tile_bytes()
    for b in range(batch):
        kb, vb = (x.float().contiguous() for x in kv_of(b))
        check(lib, lib.tkv_tq_quantize(kb.data_ptr(), vb.data_ptr(), tiles.data_ptr() + b * per_seq,
                                       1, ctx, KV_HEADS, n_blocks, seed), "quantize")
        del kb, vb


def dense_blocks(k, v):
    """k, v [copies, batch, kv_heads, ctx, D] fp16 -> paged blocks [copies, batch, n_blocks,
    2 (K, V), kv_heads, 256, D] (ctx a multiple of 256)."""
    c, b, h, ctx, d = k.shape
    nb = ctx // 256
    kb = k.view(c, b, h, nb, 256, d).permute(0, 1, 3, 2, 4, 5)
    vb = v.view(c, b, h, nb, 256, d).permute(0, 1, 3, 2, 4, 5)
    return torch.stack([kb, vb], dim=3).contiguous()


def run_case(lib, batch, ctx, variants=(), seed=0):
    torch.manual_seed(seed)
    dev = "cuda"
    scale = 1.0 / math.sqrt(D)
    tile_bytes = lib.tkv_tq_tile_bytes()
    n_blocks = n_blocks_of(ctx)
    tq_copy = batch * KV_HEADS * n_blocks * 8 * tile_bytes
    f16_copy = batch * KV_HEADS * ctx * D * 2 * 2
    tq_copies = max(1, -(-MIN_TOUCHED // tq_copy))
    f16_copies = max(1, -(-MIN_TOUCHED // f16_copy))

    k = torch.randn(f16_copies, batch, KV_HEADS, ctx, D, device=dev, dtype=torch.float16)
    v = torch.randn(f16_copies, batch, KV_HEADS, ctx, D, device=dev, dtype=torch.float16)
    q = torch.randn(batch, N_HEADS, 1, D, device=dev, dtype=torch.float16)
    q32 = q.float().contiguous()  # [batch, 1 (n_q), n_heads, D] in memory order
    lens = torch.full((batch,), ctx, dtype=torch.int32, device=dev)

    tiles = torch.zeros(tq_copies * tq_copy, dtype=torch.uint8, device=dev)
    quantize_sequences(lib, tiles, batch, ctx, seed,
                       lambda b: (k[0, b].transpose(0, 1), v[0, b].transpose(0, 1)))
    for c in range(1, tq_copies):
        tiles[c * tq_copy:(c + 1) * tq_copy].copy_(tiles[:tq_copy])
    for c in range(1, f16_copies):
        k[c].copy_(k[0])
        v[c].copy_(v[0])

    out_tq = torch.empty(batch, 1, N_HEADS, D, device=dev)
    out_dense = torch.empty_like(out_tq)
    def tq_graph(l, out, programmatic):
        return l.tkv_tq_graph(tiles.data_ptr(), n_blocks, tq_copies, tq_copy, lens.data_ptr(),
                              ctx, q32.data_ptr(), batch, N_HEADS, KV_HEADS, scale, out.data_ptr(),
                              seed, CALLS, programmatic)
    tq = tq_graph(lib, out_tq, 0)
    out_pdl = torch.empty_like(out_tq)
    tq_pdl = tq_graph(lib, out_pdl, 1)
    paged = dense_blocks(k, v)
    dense = lib.tkv_dense_graph(paged.data_ptr(), n_blocks, f16_copies, f16_copy,
                                lens.data_ptr(), ctx, q32.data_ptr(), batch, N_HEADS, KV_HEADS,
                                scale, out_dense.data_ptr(), CALLS)

    # Other builds of our library (--variant): the same TurboQuant call on the same data.
    variant_out = {name: torch.empty_like(out_tq) for name, _ in variants}
    variant_graphs = {name: (vlib, tq_graph(vlib, variant_out[name], 0),
                             tq_graph(vlib, torch.empty_like(out_tq), 1))
                      for name, vlib in variants}

    def sdpa(i):
        F.scaled_dot_product_attention(q, k[i % f16_copies], v[i % f16_copies], enable_gqa=True)
    sdpa_timer, sdpa_graph = torch_graph_timer(sdpa)
    timers = {"tq": lib_graph_timer(lib, tq, "tq attention"),
              "tq_pdl": lib_graph_timer(lib, tq_pdl, "tq attention (PDL)"),
              "dense": lib_graph_timer(lib, dense, "dense attention"), "sdpa": sdpa_timer}
    for name, (vlib, handle, pdl_handle) in variant_graphs.items():
        timers["variant " + name] = lib_graph_timer(vlib, handle, name)
        timers["variant pdl " + name] = lib_graph_timer(vlib, pdl_handle, name + " (PDL)")
    us = time_interleaved(timers)
    lib.tkv_graph_free(tq)
    lib.tkv_graph_free(tq_pdl)
    lib.tkv_graph_free(dense)
    for vlib, handle, pdl_handle in variant_graphs.values():
        vlib.tkv_graph_free(handle)
        vlib.tkv_graph_free(pdl_handle)
    del sdpa_graph
    tq_us, dense_us, sdpa_us = us["tq"], us["dense"], us["sdpa"]

    # Sanity in the same run: our dense kernel equals SDPA up to fp16; TurboQuant is close.
    ref = F.scaled_dot_product_attention(q, k[0], v[0], enable_gqa=True).float()  # [b, h, 1, d]
    ref = ref.transpose(1, 2)
    dense_err = ((out_dense - ref).norm() / ref.norm()).item()
    tq_cos = F.cosine_similarity(out_tq.flatten(1), ref.flatten(1)).min().item()
    if not torch.equal(out_pdl, out_tq):
        raise SystemExit(f"batch {batch}, {ctx}: the PDL launch's output differs from the plain "
                         f"launch's (max |diff| {(out_pdl - out_tq).abs().max().item():.1e})")
    del k, v, tiles
    torch.cuda.empty_cache()
    tokens = batch * KV_HEADS * ctx
    variant_rows = [(name, us["variant " + name], us["variant pdl " + name],
                     (variant_out[name] - out_tq).abs().max().item()) for name, _ in variants]
    return dict(batch=batch, ctx=ctx, sdpa_us=sdpa_us, dense_us=dense_us, tq_us=tq_us,
                tq_pdl_us=us["tq_pdl"],
                variants=variant_rows,
                tq_gbps=tokens * TQ_BYTES_PER_TOKEN_HEAD / (tq_us * 1e3),
                sdpa_gbps=tokens * F16_BYTES_PER_TOKEN_HEAD / (sdpa_us * 1e3),
                dense_gbps=tokens * F16_BYTES_PER_TOKEN_HEAD / (dense_us * 1e3),
                dense_rel_err=dense_err, tq_min_cos=tq_cos)


TIMELINE_POINTS = 8  # attn::kTimelinePoints: entry, prologue, loop, partial, published, merged, sm,
#                      merger


def timeline_case(lib, batch, ctx, reps=7, seed=0):
    """Per-block %globaltimer stamps of single calls: where a call's time goes."""
    torch.manual_seed(seed)
    n_blocks = n_blocks_of(ctx)
    tiles = torch.zeros(batch * KV_HEADS * n_blocks * 8 * lib.tkv_tq_tile_bytes(),
                        dtype=torch.uint8, device="cuda")
    quantize_sequences(lib, tiles, batch, ctx, seed,
                       lambda b: (torch.randn(ctx, KV_HEADS, D, device="cuda"),
                                  torch.randn(ctx, KV_HEADS, D, device="cuda")))
    q = torch.randn(batch, 1, N_HEADS, D, device="cuda")
    lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    out = torch.empty(batch, 1, N_HEADS, D, device="cuda")
    max_blocks = 4096
    host = torch.zeros(reps, max_blocks, TIMELINE_POINTS, dtype=torch.int64)
    check(lib, lib.tkv_tq_timeline(tiles.data_ptr(), n_blocks, lens.data_ptr(), ctx, q.data_ptr(),
                                   batch, N_HEADS, KV_HEADS, 1.0 / math.sqrt(D), out.data_ptr(),
                                   seed, reps, max_blocks, host.data_ptr()), "timeline")
    rows = []
    for r in range(reps):
        t = host[r]
        t = t[t[:, 0] != 0].double()
        t0 = t[:, 0].min()
        work = t[t[:, 1] != 0]
        last = work[work[:, 7] == 1]
        span = (last[:, 5].max() - t0) / 1e3
        rows.append((span.item(), t, work, last, t0))
    rows.sort(key=lambda x: x[0])
    span, t, work, last, t0 = rows[len(rows) // 2]

    def q3(x):
        if x.numel() == 0:
            return "     -      -      -"
        x = x / 1e3
        return f"{x.min().item():6.2f} {x.median().item():6.2f} {x.max().item():6.2f}"

    print(f"{batch:>5} {ctx:>8} blocks {len(t):>4} (working {len(work)}, SMs {len(set(work[:, 6].tolist()))}) "
          f"span {span:6.2f} us (min/med/max of {reps} calls: "
          f"{rows[0][0]:.2f}/{span:.2f}/{rows[-1][0]:.2f})")
    print(f"      start skew {q3(t[:, 0] - t0)} | prologue {q3(work[:, 1] - work[:, 0])} | "
          f"loop {q3(work[:, 2] - work[:, 1])} | loop end {q3(work[:, 2] - t0)}")
    tail = (last[:, 5].max() - work[:, 2].max()) / 1e3
    others = work[work[:, 7] == 0]
    print(f"      partial {q3(work[:, 3] - work[:, 2])} | publish {q3(others[:, 4] - others[:, 3])} | "
          f"merger's wait {q3(last[:, 4] - last[:, 3])} | merge {q3(last[:, 5] - last[:, 4])} | "
          f"last loop end->done {tail.item():6.2f}", flush=True)
    del tiles


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", required=True)
    parser.add_argument("--cases", help="comma-separated batch:context list (default: all)")
    parser.add_argument("--timeline", action="store_true",
                        help="print per-block stage timings (µs, min/median/max over blocks) of "
                             "single calls instead of the benchmark table")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=LIB",
                        help="also time the TurboQuant call of another build of the library on "
                             "the same data, interleaved with the others (repeatable); prints "
                             "its us, speedup over SDPA and max |out - out_lib|, plain and with "
                             "PDL")
    args = parser.parse_args()
    lib = load_lib(args.lib)
    variants = [(v.split("=", 1)[0], load_lib(v.split("=", 1)[1])) for v in args.variant]
    props = torch.cuda.get_device_properties(0)
    cases = [(1, 4096), (1, 32768), (1, 131072), (1, 524288), (16, 4096), (16, 32768),
             (16, 131072)]
    if args.cases:
        cases = [tuple(int(x) for x in c.split(":")) for c in args.cases.split(",")]
    print(f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {props.name}, {props.multi_processor_count} SMs, "
          f"torch {torch.__version__}, CUDA {torch.version.cuda}")
    print(f"# decode attention, {N_HEADS} query / {KV_HEADS} KV heads, d={D}, fp16 SDPA "
          f"(enable_gqa=True) vs ours; CUDA-graph timing, interleaved, median "
          f"of {REPS} x {CALLS} calls")
    if args.timeline:
        print("# timeline: us from the call's first block start; min median max over blocks")
        for batch, ctx in cases:
            timeline_case(lib, batch, ctx)
        return
    bw = copy_bandwidth()
    print(f"# device-to-device copy bandwidth (read+write): {bw:.0f} GB/s")
    header = (f"{'batch':>5} {'context':>8} {'sdpa_us':>9} {'dense_us':>9} {'tq35_us':>9} "
              f"{'tq/sdpa':>8} {'tq/dense':>8} {'pdl_us':>8} {'pdl/sdpa':>8} {'sdpa_GB/s':>9} "
              f"{'tq_GB/s':>8} {'tq_%copy':>8} {'dense_err':>9} {'tq_cos':>7}")
    print(header)
    for batch, ctx in cases:
        r = run_case(lib, batch, ctx, variants)
        print(f"{r['batch']:>5} {r['ctx']:>8} {r['sdpa_us']:>9.1f} {r['dense_us']:>9.1f} "
              f"{r['tq_us']:>9.1f} {r['sdpa_us'] / r['tq_us']:>7.2f}x "
              f"{r['dense_us'] / r['tq_us']:>7.2f}x {r['tq_pdl_us']:>8.1f} "
              f"{r['sdpa_us'] / r['tq_pdl_us']:>7.2f}x {r['sdpa_gbps']:>9.0f} {r['tq_gbps']:>8.0f} "
              f"{100 * r['tq_gbps'] / bw:>7.0f}% {r['dense_rel_err']:>9.1e} {r['tq_min_cos']:>7.4f}",
              flush=True)
        for name, v_us, v_pdl_us, diff in r["variants"]:
            print(f"#   variant {name:>12} {v_us:9.1f} us  {r['sdpa_us'] / v_us:5.2f}x vs sdpa  "
                  f"{v_us / r['tq_us']:6.3f} of tq35  max|diff| {diff:.1e} | PDL {v_pdl_us:.1f} us "
                  f"{r['sdpa_us'] / v_pdl_us:5.2f}x {v_pdl_us / r['tq_pdl_us']:6.3f} of pdl",
                  flush=True)


if __name__ == "__main__":
    main()
