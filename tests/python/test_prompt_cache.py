"""Saved sessions on the shipped model, through the Python module and the CLI: a session saved
by one process and loaded by a new one goes on with exactly the tokens one uninterrupted run
produces; corrupted, truncated and mismatched files (other KV settings, another model) are
refused with a clear message; the chat REPL reuses its history's KV each turn."""
import json
import os
import shutil
import subprocess
import sys

import pytest

import turbokv

ROOT = os.environ.get("TURBOKV_SOURCE_DIR",
                      os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL = os.path.join(ROOT, "models", "tinycode-llama")
BINARY = os.environ.get("TURBOKV_BINARY", "build/turbokv")
PROMPT = "def quicksort(items):\n    if len(items) <= 1:\n        return items\n"


def turbokv_cli(*args, stdin=None):
    return subprocess.run([BINARY, *args], input=stdin, capture_output=True, text=True,
                          timeout=300)


def generate_json(*args):
    r = turbokv_cli("generate", "--json", "--ignore-eos", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def in_new_process(code):
    """Runs Python code in a fresh interpreter (a new process: nothing shared but files)."""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def loaded():
    return turbokv.load(MODEL)


def tokens_of(model, processor, prompt, **kw):
    return [c.token for c in turbokv.stream_generate(model, processor, prompt, **kw)
            if c.token >= 0]


@pytest.mark.parametrize("kv", [{}, {"kv_bits": 3.5}, {"kv_bits": 4}])
def test_python_session_saved_and_loaded_in_a_new_process_goes_on_exactly(loaded, tmp_path, kv):
    model, processor = loaded
    whole = tokens_of(model, processor, PROMPT, max_tokens=24, ignore_eos=True, **kv)
    path = str(tmp_path / "session.tkv")
    cache = turbokv.make_cache(model, **kv)
    first = tokens_of(model, processor, PROMPT, max_tokens=12, ignore_eos=True,
                      prompt_cache=cache)
    assert len(cache.tokens) == len(processor.encode(PROMPT)) + 12
    assert cache.cached_tokens == len(cache.tokens) - 1
    turbokv.save_cache(path, cache, {"note": "first half"})
    rest = in_new_process(f"""
import json, turbokv
model, processor = turbokv.load({MODEL!r})
cache, meta = turbokv.load_cache(model, {path!r}, return_metadata=True)
chunks = list(turbokv.stream_generate(model, processor, cache.tokens, max_tokens=12,
                                      ignore_eos=True, prompt_cache=cache))
print(json.dumps({{"meta": meta, "tokens": [c.token for c in chunks if c.token >= 0],
                   "reused": chunks[-1].prompt_cached_tokens}}))
""")
    assert rest["meta"] == {"note": "first half"}
    assert rest["reused"] == len(processor.encode(PROMPT)) + 12 - 1
    assert first + rest["tokens"] == whole


def test_python_bad_cache_files_are_refused(loaded, tmp_path):
    model, processor = loaded
    cache = turbokv.make_cache(model, kv_bits=3.5)
    turbokv.generate(model, processor, PROMPT, max_tokens=4, prompt_cache=cache)
    path = tmp_path / "good.tkv"
    turbokv.save_cache(str(path), cache)
    good = path.read_bytes()
    bad = tmp_path / "bad.tkv"
    for at in (20, len(good) // 2, len(good) - 5):
        flipped = bytearray(good)
        flipped[at] ^= 0x01
        bad.write_bytes(bytes(flipped))
        with pytest.raises(RuntimeError, match="corrupted"):
            turbokv.load_cache(model, str(bad))
    bad.write_bytes(good[: len(good) - 100])
    with pytest.raises(RuntimeError, match="truncated"):
        turbokv.load_cache(model, str(bad))
    with pytest.raises(ValueError, match="KV settings"):
        turbokv.load_cache(model, str(path), kv_bits=4)
    with pytest.raises(RuntimeError, match="cannot open"):
        turbokv.load_cache(model, str(tmp_path / "missing.tkv"))
    assert turbokv.load_cache(model, str(path), kv_bits=3.5).tokens == cache.tokens
    with pytest.raises(TypeError, match="prompt_cache"):
        turbokv.generate(model, processor, PROMPT, prompt_cache="not a cache")


def other_model(tmp_path):
    """The shipped weights with another configuration: another model."""
    other = tmp_path / "other-model"
    other.mkdir()
    for name in os.listdir(MODEL):
        if name != "config.json":
            os.symlink(os.path.join(MODEL, name), other / name)
    config = json.load(open(os.path.join(MODEL, "config.json")))
    config["rms_norm_eps"] = 2e-5
    (other / "config.json").write_text(json.dumps(config))
    return str(other)


def test_cli_prompt_cache_continue_in_a_new_process_equals_one_run(tmp_path):
    path = str(tmp_path / "cli.tkv")
    whole = generate_json("--prompt", PROMPT, "--max-tokens", "20", "--kv-bits", "3.5")
    first = generate_json("--prompt", PROMPT, "--max-tokens", "10", "--kv-bits", "3.5",
                          "--prompt-cache", path)
    assert first["prompt_cached_tokens"] == 0
    rest = generate_json("--continue", "--max-tokens", "10", "--kv-bits", "3.5",
                         "--prompt-cache", path)
    assert rest["prompt_cached_tokens"] == first["prompt_tokens"] + 10 - 1
    assert first["tokens"] + rest["tokens"] == whole["tokens"]
    # The same prompt again: only its last token is prefilled, the output is the same.
    again = generate_json("--prompt", PROMPT, "--max-tokens", "20", "--kv-bits", "3.5",
                          "--prompt-cache", path)
    assert again["prompt_cached_tokens"] == again["prompt_tokens"] - 1
    assert again["tokens"] == whole["tokens"]


def test_cli_bad_prompt_cache_files_are_clear_errors(tmp_path):
    path = tmp_path / "cli.tkv"
    generate_json("--prompt", PROMPT, "--max-tokens", "4", "--prompt-cache", str(path))
    good = path.read_bytes()
    r = turbokv_cli("generate", "--prompt", PROMPT, "--kv-bits", "3.5", "--prompt-cache", str(path))
    assert r.returncode == 2 and "KV settings" in r.stderr, r.stderr
    r = turbokv_cli("generate", "--prompt", PROMPT, "--model", other_model(tmp_path),
                    "--prompt-cache", str(path))
    assert r.returncode == 2 and "another model" in r.stderr, r.stderr
    flipped = bytearray(good)
    flipped[len(good) // 2] ^= 0x40
    path.write_bytes(bytes(flipped))
    r = turbokv_cli("generate", "--prompt", PROMPT, "--prompt-cache", str(path))
    assert r.returncode == 1 and "corrupted" in r.stderr, r.stderr
    path.write_bytes(good[:40])
    r = turbokv_cli("generate", "--prompt", PROMPT, "--prompt-cache", str(path))
    assert r.returncode == 1 and "truncated" in r.stderr, r.stderr
    path.write_bytes(good)  # the refusals left the file as it was
    r = turbokv_cli("generate", "--continue", "--prompt-cache", str(tmp_path / "none.tkv"))
    assert r.returncode == 2 and "no saved tokens" in r.stderr, r.stderr


def test_chat_reuses_the_kv_of_its_history_each_turn(tmp_path):
    path = str(tmp_path / "chat.tkv")
    r = turbokv_cli("chat", "--max-tokens", "12", "--stats", "--prompt-cache", path,
                    stdin="write a function\nnow add a docstring\n")
    assert r.returncode == 0, r.stderr
    turns = [line for line in r.stderr.splitlines() if line.startswith("[prompt")]
    assert len(turns) == 2, r.stderr
    prompt = [int(t.split()[1]) for t in turns]
    cached = [int(t.split()[3]) for t in turns]
    assert cached[0] == 0
    # Turn 2 prefills only what is new: the reply's end and the second message.
    assert cached[1] > prompt[0], turns
    assert prompt[1] - cached[1] < 30, turns
    # A new process resumes the conversation from the file.
    r = turbokv_cli("chat", "--max-tokens", "12", "--stats", "--prompt-cache", path,
                    stdin="and a test\n")
    assert r.returncode == 0, r.stderr
    turn = [line for line in r.stderr.splitlines() if line.startswith("[prompt")][0]
    assert int(turn.split()[3]) > prompt[1], turn
