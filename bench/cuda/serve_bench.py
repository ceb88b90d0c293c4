#!/usr/bin/env python3
"""Concurrent serving on the GPU: N streaming chat requests at once against `turbokv server
--device cuda`, half with the server's dense cache and half with kv_bits 3.5; every text must
equal the same request made alone (greedy). Then the total decode tok/s of N dense-only
requests vs N TurboQuant-only ones, each measured with all N in flight.

usage: bench/cuda/serve_bench.py --bin build/turbokv [--model DIR] [--requests 64]
         [--prompt-tokens 4096] [--max-tokens 256] [--port 8089] [--batch-invariant]
         [--queue-pool-gb GB]
--batch-invariant starts the server with --batch-invariant (the texts must then be equal; without
it they may differ where two tokens are nearly tied, since batched products round differently).
--queue-pool-gb then starts a second server with a KV pool of that size, too small for the
requests at once: 8 concurrent ones must all complete (queued for pool blocks), counted in
/metrics as turbokv_kv_pool_waits_total.
Standard library only.
"""
import argparse
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request


def post(url, body, stream):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        if not stream:
            return json.loads(r.read())
        text, usage, error = [], None, None
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("error"):
                error = event["error"]
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices", []):
                text.append(choice.get("delta", {}).get("content") or "")
        return {"text": "".join(text), "usage": usage, "error": error}


def post_or_error(url, body):
    """A streamed request's result; a refused or broken connection is a result too."""
    try:
        return post(url, body, True)
    except urllib.error.HTTPError as e:
        return {"text": None, "usage": None, "error": f"HTTP {e.code}: {e.read().decode()[:300]}"}
    except Exception as e:  # noqa: BLE001 - the caller reports it
        return {"text": None, "usage": None, "error": f"{type(e).__name__}: {e}"}


def report_failures(label, results):
    """Prints each request of a run that did not complete; returns how many."""
    failed = [(i, r) for i, r in enumerate(results) if not r["usage"]]
    for i, r in failed:
        print(f"{label}: request {i} failed: {r['error'] or 'no usage in the stream'}", flush=True)
    return len(failed)


def prompt_of(i, words):
    # Distinct prompts: a long shared-looking body with a per-request header.
    body = " ".join(f"x{(j * 7919 + i) % 1000}" for j in range(words))
    return f"Request {i}. Continue this list:\n{body}"


def start_server(cmd, port):
    """Starts `turbokv server` and waits until /health answers; returns (process, base URL)."""
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(base + "/health", timeout=1)
            break
        except Exception:
            time.sleep(0.5)
    return server, base


def stop_server(server):
    """Stops the server; returns the tail of its output ("" if it had to be killed)."""
    server.terminate()
    try:
        out, _ = server.communicate(timeout=20)
        return out.decode()[-2000:]
    except subprocess.TimeoutExpired:
        server.kill()
        return ""


def queued_run(args, cmd, words):
    """A server whose KV pool holds fewer requests than arrive: all must complete."""
    port = args.port + 1
    small = cmd[:cmd.index("--port")] + ["--port", str(port)] + \
        cmd[cmd.index("--port") + 2:] + ["--kv-cache-gb", str(args.queue_pool_gb)]
    server, base = start_server(small, port)
    try:
        results = [None] * 8

        def one(i):
            results[i] = post_or_error(base + "/v1/chat/completions", {
                "messages": [{"role": "user", "content": prompt_of(1000 + i, words)}],
                "max_tokens": 32, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}})

        threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        done = sum(1 for r in results if r["usage"])
        metrics = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
        waits = [line for line in metrics.splitlines()
                 if line.startswith("turbokv_kv_pool_waits_total")]
        print(f"--kv-cache-gb {args.queue_pool_gb}: {done}/8 concurrent requests completed; "
              f"{waits[0] if waits else 'no pool-wait metric'}", flush=True)
        report_failures(f"--kv-cache-gb {args.queue_pool_gb}", results)
        return done == 8
    finally:
        stop_server(server)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=4096)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--port", type=int, default=8089)
    ap.add_argument("--batch-invariant", action="store_true")
    ap.add_argument("--queue-pool-gb", type=float)
    ap.add_argument("--device", default="cuda", help="cuda (default), or cpu to try the script")
    args = ap.parse_args()
    cmd = [args.bin, "server", "--device", args.device, "--port", str(args.port),
           "--max-sequences", str(args.requests), "--max-tokens-limit", "4096"]
    if args.model:
        cmd += ["--model", args.model]
    if args.batch_invariant:
        cmd += ["--batch-invariant"]
    server, base = start_server(cmd, args.port)
    try:
        url = base + "/v1/chat/completions"
        # prompt_tokens / 2 words; with the shipped tokenizer a word is ~4 tokens, so 2000
        # gives ~3900-token prompts (the "prompts:" line prints what was sent).
        words = max(1, args.prompt_tokens // 2)

        def body(i, kv):
            b = {"messages": [{"role": "user", "content": prompt_of(i, words)}],
                 "max_tokens": args.max_tokens, "temperature": 0, "stream": True,
                 "stream_options": {"include_usage": True}}
            if kv is not None:
                b["kv_bits"] = kv
            return b

        def run_all(kinds):
            results = [None] * len(kinds)

            def one(i):
                results[i] = post_or_error(url, body(i, kinds[i]))

            threads = [threading.Thread(target=one, args=(i,)) for i in range(len(kinds))]
            start = time.time()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            seconds = time.time() - start
            tokens = sum(r["usage"]["completion_tokens"] for r in results if r and r["usage"])
            return results, seconds, tokens

        n = args.requests
        mixed = [None if i % 2 == 0 else 3.5 for i in range(n)]
        got, seconds, tokens = run_all(mixed)
        prompt = [r["usage"]["prompt_tokens"] for r in got if r["usage"]]
        print(f"turbokv {' '.join(cmd[1:])}", flush=True)
        if prompt:
            print(f"prompts: {min(prompt)}..{max(prompt)} tokens", flush=True)
        print(f"{n} concurrent streams (half dense, half kv_bits 3.5): {tokens} tokens in "
              f"{seconds:.1f} s, {tokens / seconds:.1f} tok/s", flush=True)
        failures = report_failures("concurrent", got)
        mismatches = 0
        for i in range(n):
            alone = post_or_error(url, body(i, mixed[i]))
            if not got[i]["usage"] or not alone["usage"] or alone["text"] != got[i]["text"]:
                mismatches += 1
                what = ("batched text differs from the same request alone"
                        if got[i]["usage"] and alone["usage"] else
                        f"failed: {got[i]['error'] or alone['error']}")
                print(f"request {i} ({'dense' if mixed[i] is None else 'kv_bits 3.5'}): {what}",
                      flush=True)
        print(f"same text as alone: {n - mismatches}/{n}", flush=True)
        for label, kind in (("dense-only", None), ("TurboQuant 3.5-only", 3.5)):
            results, seconds, tokens = run_all([kind] * n)
            print(f"{label}: {n} streams, {tokens} tokens in {seconds:.1f} s, "
                  f"{tokens / seconds:.1f} tok/s", flush=True)
            failures += report_failures(label, results)
        # A request the server cannot serve (no such KV width) is a 400; the server keeps serving.
        bad_status = None
        try:
            post(url, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                       "kv_bits": 99}, False)
        except urllib.error.HTTPError as e:
            bad_status = e.code
        print(f"kv_bits 99: {f'HTTP {bad_status}' if bad_status else 'accepted (expected a 400)'}",
              flush=True)
        urllib.request.urlopen(base + "/health", timeout=5)
        print("server still healthy", flush=True)
        failed = bool(mismatches or failures) or bad_status != 400
        if args.queue_pool_gb:
            failed |= not queued_run(args, cmd, words)
        sys.exit(1 if failed else 0)
    finally:
        sys.stdout.write(stop_server(server))


if __name__ == "__main__":
    main()
