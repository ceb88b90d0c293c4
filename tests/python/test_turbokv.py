"""The turbokv Python module on the shipped model: HF golden tokens, the KV selection
rules and exact KV sizes, streaming, errors as Python exceptions, concurrent calls."""
import json
import os
import signal
import struct
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import turbokv

ROOT = os.environ.get("TURBOKV_SOURCE_DIR",
                      os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL = os.path.join(ROOT, "models", "tinycode-llama")
REFERENCE = os.path.join(ROOT, "tests", "fixtures", "tinycode-llama-reference.safetensors")
# Per token per KV head: TurboQuant K3/V4 = (3*128 + 16 + 4*128 + 16) / 8 = 116 bytes,
# dense fp16 K+V = 2*128*2 = 512 bytes (docs/design.md, "TurboQuant"). tinycode-llama: 6 layers, 2 KV heads.
LAYERS, KV_HEADS = 6, 2


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    dtypes = {"I64": np.int64, "I32": np.int32, "F32": np.float32}
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        begin, end = meta["data_offsets"]
        out[name] = np.frombuffer(data[begin:end], dtype=dtypes[meta["dtype"]]).reshape(
            meta["shape"])
    return out


@pytest.fixture(scope="module")
def loaded():
    return turbokv.load(MODEL)


def last_chunk(model, processor, prompt, **kw):
    chunks = list(turbokv.stream_generate(model, processor, prompt, **kw))
    return chunks, chunks[-1]


def test_greedy_tokens_equal_hf_transformers(loaded):
    model, processor = loaded
    ref = read_safetensors(REFERENCE)
    prompt = [int(t) for t in ref["input_ids"].reshape(-1)]
    want = [int(t) for t in ref["generated"].reshape(-1)]
    chunks, _ = last_chunk(model, processor, prompt, max_tokens=len(want), ignore_eos=True)
    got = [c.token for c in chunks if c.token >= 0]
    assert got == want


def test_readme_line_generates_text():
    m, p = turbokv.load(MODEL)
    text = turbokv.generate(m, p, "import os", kv_bits=3.5, max_tokens=16)
    assert isinstance(text, str) and text


def test_default_path_is_the_shipped_model():
    model, _ = turbokv.load()
    assert model.model_type == "llama" and model.num_layers == LAYERS


def test_stream_text_equals_generate_text(loaded):
    model, processor = loaded
    text = turbokv.generate(model, processor, "def add(a, b):", max_tokens=40)
    chunks, last = last_chunk(model, processor, "def add(a, b):", max_tokens=40)
    assert "".join(c.text for c in chunks) == text
    assert last.finish_reason in ("stop", "length")
    assert last.prompt_tokens == len(processor.encode("def add(a, b):"))


@pytest.mark.parametrize("kw, scheme, key_bits, value_bits", [
    (dict(kv_bits=3.5), "turboquant", 3, 4),
    (dict(kv_bits=4, kv_quant_scheme="turboquant"), "turboquant", 4, 4),
    (dict(kv_bits=4), "uniform", 4, 4),
    (dict(), "dense", 16, 16),
])
def test_kv_selection_rules(loaded, kw, scheme, key_bits, value_bits):
    model, processor = loaded
    _, last = last_chunk(model, processor, "import sys", max_tokens=4, **kw)
    assert (last.kv_scheme, last.kv_key_bits, last.kv_value_bits) == (scheme, key_bits,
                                                                      value_bits)


def test_kv_bytes_at_3_5_bits_are_exact(loaded):
    model, processor = loaded
    _, last = last_chunk(model, processor, "def fibonacci(n):", max_tokens=24, kv_bits=3.5,
                         ignore_eos=True)
    tokens = last.prompt_tokens + last.generation_tokens - 1  # the last token is not fed back
    assert last.cached_tokens == tokens
    assert last.kv_bytes == tokens * KV_HEADS * (5 * 116 + 512)
    assert last.kv_bytes_dense == tokens * KV_HEADS * LAYERS * 512


def test_turboquant_levers_reach_the_cache(loaded):
    model, processor = loaded
    args = dict(max_tokens=16, kv_bits=3.5, ignore_eos=True)
    _, plain = last_chunk(model, processor, "def fibonacci(n):", **args)
    _, every = last_chunk(model, processor, "def fibonacci(n):", kv_quantize_last_layer=True,
                          **args)
    tokens = every.prompt_tokens + every.generation_tokens - 1
    assert every.kv_bytes == tokens * KV_HEADS * LAYERS * 116
    _, sinks = last_chunk(model, processor, "def fibonacci(n):", kv_sink_tokens=4,
                          kv_centering="both", kv_recent_tokens=3, kv_unbiased_norm=True, **args)
    assert sinks.kv_bytes > plain.kv_bytes
    _, layers = last_chunk(model, processor, "def fibonacci(n):", kv_layer_bits="-1:3/4", **args)
    assert layers.kv_bytes == every.kv_bytes


@pytest.mark.parametrize("kw, error, named", [
    (dict(kv_centering="keys"), ValueError, "kv_centering"),  # dense cache
    (dict(kv_bits=3.5, kv_centering="sideways"), ValueError, "kv_centering"),
    (dict(kv_bits=3.5, kv_centering=1), TypeError, "kv_centering"),
    (dict(kv_bits=3.5, kv_sink_tokens=-1), ValueError, "kv_sink_tokens"),
    (dict(kv_bits=3.5, kv_recent_tokens=2000), ValueError, "kv_recent_tokens"),
    (dict(kv_bits=3.5, kv_recent_tokens="3"), TypeError, "kv_recent_tokens"),
    (dict(kv_bits=3.5, kv_allocation="auto"), ValueError, "kv_allocation"),
    (dict(kv_bits=3.5, kv_budget=3.5), ValueError, "kv_budget"),
    (dict(kv_bits=3.5, kv_layer_bits="x"), ValueError, "kv_layer_bits"),
    (dict(kv_bits=3.5, kv_hadamard=True), ValueError, "kv_hadamard"),
    (dict(kv_bits=4, kv_sink_tokens=4), ValueError, "kv_sink_tokens"),
    (dict(kv_bits=3.5, kv_unbiased_norm=1), TypeError, "kv_unbiased_norm"),
    (dict(kv_bits=3.5, kv_unbiased_norm=True, kv_norm_correction=False), ValueError,
     "kv_unbiased_norm"),
])
def test_bad_kv_levers_name_the_argument(loaded, kw, error, named):
    model, processor = loaded
    with pytest.raises(error, match=named):
        turbokv.generate(model, processor, "x", max_tokens=2, **kw)


def test_dense_kv_bytes_equal_the_dense_equivalent(loaded):
    model, processor = loaded
    _, last = last_chunk(model, processor, "x = 1", max_tokens=8, ignore_eos=True)
    assert last.kv_bytes == last.kv_bytes_dense == last.cached_tokens * KV_HEADS * LAYERS * 512


@pytest.mark.parametrize("kw", [
    dict(kv_bits=0.3), dict(kv_bits=2.25), dict(kv_bits=9), dict(kv_bits="abc"),
    dict(kv_bits=4, kv_quant_scheme="foo"),
])
def test_bad_kv_options_are_value_errors(loaded, kw):
    model, processor = loaded
    with pytest.raises(ValueError, match="kv_"):
        turbokv.generate(model, processor, "x", max_tokens=2, **kw)
    with pytest.raises(ValueError, match="kv_"):
        turbokv.load(MODEL, **kw)


@pytest.mark.parametrize("kw", [dict(max_tokens=0), dict(temperature=-1.0), dict(top_p=0.0)])
def test_bad_sampling_options_are_value_errors(loaded, kw):
    model, processor = loaded
    with pytest.raises(ValueError):
        turbokv.generate(model, processor, "x", **kw)


def test_unknown_keyword_is_a_type_error(loaded):
    model, processor = loaded
    with pytest.raises(TypeError, match="max_tokenz"):
        turbokv.generate(model, processor, "x", max_tokenz=3)


def test_batch_invariant_on_the_cpu_is_a_value_error():
    with pytest.raises(ValueError, match="batch-invariant"):
        turbokv.load(batch_invariant=True)


def test_missing_model_dir_is_a_runtime_error():
    with pytest.raises(RuntimeError, match="does-not-exist"):
        turbokv.load("/does-not-exist")


def test_stop_string_ends_the_text_before_it(loaded):
    model, processor = loaded
    full = turbokv.generate(model, processor, "def fibonacci(n):", max_tokens=48)
    assert "\n" in full
    text = turbokv.generate(model, processor, "def fibonacci(n):", max_tokens=48, stop="\n")
    assert text == full[:full.index("\n")]


def test_concurrent_calls_from_threads_equal_solo_calls(loaded):
    model, processor = loaded
    prompts = ["import os", "class Stack:", "def main():", "for i in range(10):"]
    solo = [turbokv.generate(model, processor, p, max_tokens=24) for p in prompts]
    results = [None] * len(prompts)

    def run(i):
        results[i] = turbokv.generate(model, processor, prompts[i], max_tokens=24)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == solo


def test_chat_template_renders_chatml(loaded):
    _, processor = loaded
    text = processor.apply_chat_template([{"role": "user", "content": "hi"}])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_sampling_is_reproducible_with_a_seed(loaded):
    model, processor = loaded
    kw = dict(max_tokens=24, temperature=0.9, top_p=0.95, seed=11)
    assert (turbokv.generate(model, processor, "import", **kw) ==
            turbokv.generate(model, processor, "import", **kw))


def test_padded_vocab_ids_are_never_sampled():
    # config.json says 512 ids, the tokenizer has 257 (tests/fixtures/padded-vocab/README.md).
    model, processor = turbokv.load(os.path.join(ROOT, "tests", "fixtures", "padded-vocab"))
    for seed in range(3):
        chunks = list(turbokv.stream_generate(model, processor, "hello", max_tokens=200,
                                              temperature=1.5, seed=seed, ignore_eos=True))
        tokens = [c.token for c in chunks if c.token >= 0]
        assert len(tokens) == 200
        assert max(tokens) < 257


def test_one_stream_consumed_from_two_threads_ends_for_both(loaded):
    model, processor = loaded
    kw = dict(max_tokens=40, ignore_eos=True)
    solo = [c.token for c in turbokv.stream_generate(model, processor, "import os", **kw)]
    it = turbokv.stream_generate(model, processor, "import os", **kw)
    got = [[], []]

    def consume(i):
        for chunk in it:
            got[i].append(chunk.token)

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a consumer never saw the end"
    assert sorted(got[0] + got[1]) == sorted(solo)  # every chunk went to exactly one thread
    with pytest.raises(StopIteration):
        next(it)


def test_ctrl_c_interrupts_a_blocking_generate():
    script = (
        "import signal, sys, time, turbokv\n"
        # A parent that ignores SIGINT (ctest) makes Python skip its handler: install it.
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "m, p = turbokv.load(sys.argv[1])\n"
        "print('ready', flush=True)\n"
        "t0 = time.time()\n"
        "try:\n"
        "    turbokv.generate(m, p, 'import os', max_tokens=100000, ignore_eos=True)\n"
        "    print('finished')\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted after %.1f s' % (time.time() - t0))\n")
    env = dict(os.environ)
    child = subprocess.Popen([sys.executable, "-c", script, MODEL], stdout=subprocess.PIPE,
                             text=True, env=env)
    try:
        assert child.stdout.readline().strip() == "ready"
        time.sleep(1.0)
        child.send_signal(signal.SIGINT)
        out, _ = child.communicate(timeout=30)
    finally:
        child.kill()
    assert out.startswith("interrupted"), out
    assert child.returncode == 0


@pytest.mark.parametrize("kw, error, named", [
    (dict(max_tokens="8"), TypeError, "max_tokens"),
    (dict(max_tokens=2 ** 40), ValueError, "max_tokens"),
    (dict(max_tokens=True), TypeError, "max_tokens"),
    (dict(top_k=2 ** 32), ValueError, "top_k"),
    (dict(top_k=1.5), TypeError, "top_k"),
    (dict(seed=-1), ValueError, "seed"),
    (dict(seed="s"), TypeError, "seed"),
    (dict(temperature="hot"), TypeError, "temperature"),
    (dict(presence_penalty=3.0), ValueError, "presence_penalty"),
    (dict(stop=5), TypeError, "stop"),
    (dict(stop=["a", 5]), TypeError, "stop"),
    (dict(ignore_eos="yes"), TypeError, "ignore_eos"),
    (dict(kv_bits=4, kv_group_size=2 ** 40), ValueError, "kv_group_size"),
    (dict(kv_group_size="64"), TypeError, "kv_group_size"),
    (dict(kv_seed=-5), ValueError, "kv_seed"),
    (dict(quantized_kv_start=-1), ValueError, "quantized_kv_start"),
])
def test_bad_argument_types_and_ranges_name_the_argument(loaded, kw, error, named):
    model, processor = loaded
    with pytest.raises(error, match=named):
        turbokv.generate(model, processor, "x", **kw)


def test_bad_prompts_messages_and_paths_are_type_errors(loaded):
    model, processor = loaded
    with pytest.raises(TypeError, match="prompt"):
        turbokv.generate(model, processor, 5)
    with pytest.raises(ValueError, match="prompt"):
        turbokv.generate(model, processor, [1, -2])
    with pytest.raises(TypeError, match=r"messages\[0\]"):
        processor.apply_chat_template([1])
    with pytest.raises(TypeError, match=r"messages\[0\]\['content'\]"):
        processor.apply_chat_template([{"role": "user", "content": 5}])
    with pytest.raises(TypeError, match="path"):
        turbokv.load(5)
