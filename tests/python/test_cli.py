"""The `turbokv` CLI's generate and chat commands: --json fields and exact KV bytes, the
KV selection errors as exit code 2, --compare-dense, and the chat REPL commands."""
import json
import os
import shutil
import subprocess

import pytest

BINARY = os.environ.get("TURBOKV_BINARY", "build/turbokv")
ROOT = os.environ.get("TURBOKV_SOURCE_DIR",
                      os.path.join(os.path.dirname(__file__), "..", ".."))
# vocab_size 512 in config.json, 257 ids in the tokenizer (tests/fixtures/padded-vocab/README.md).
PADDED = os.path.join(ROOT, "tests", "fixtures", "padded-vocab")
# Per token per KV head (docs/design.md, "TurboQuant"): TurboQuant K3/V4 116 B, dense fp16 512 B. tinycode-llama has
# 6 layers (the last kept dense) and 2 KV heads.
TQ35_BYTES_PER_TOKEN = 2 * (5 * 116 + 512)
DENSE_BYTES_PER_TOKEN = 2 * 6 * 512


def turbokv(*args, stdin=None):
    return subprocess.run([BINARY, *args], input=stdin, capture_output=True, text=True,
                          timeout=300)


def test_generate_json_has_every_field_and_exact_kv_bytes():
    r = turbokv("generate", "--prompt", "def fibonacci(n):", "--max-tokens", "64", "--kv-bits",
                "3.5", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    for key in ("text", "prompt_tokens", "generated_tokens", "prompt_tps", "generation_tps",
                "kv_bytes", "kv_bytes_dense", "kv_scheme"):
        assert key in out, key
    assert out["kv_scheme"] == "turboquant"
    assert (out["kv_key_bits"], out["kv_value_bits"]) == (3, 4)
    fed_back = 1 if out["finish_reason"] == "length" else 0
    cached = out["prompt_tokens"] + out["generated_tokens"] - fed_back
    assert out["cached_tokens"] == cached
    assert out["kv_bytes"] == cached * TQ35_BYTES_PER_TOKEN
    assert out["kv_bytes_dense"] == cached * DENSE_BYTES_PER_TOKEN
    assert any(word in out["text"] for word in ("return", "def", "if", "("))


@pytest.mark.parametrize("flags, named", [
    (["--kv-bits", "0.3"], "0.3"),
    (["--kv-bits", "2.25"], "2.25"),
    (["--kv-bits", "9"], "9"),
    (["--kv-bits", "abc"], "abc"),
    (["--kv-bits", "4", "--kv-quant-scheme", "foo"], "foo"),
    (["--max-tokens", "0"], "max_tokens"),
    (["--temperature", "-1"], "temperature"),
    (["--device", "cuda"], "cuda"),
    (["--batch-invariant"], "--batch-invariant"),
])
def test_bad_values_exit_2_naming_the_value(flags, named):
    r = turbokv("generate", "--prompt", "x", *flags)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert named in r.stderr
    assert r.stdout == ""


def test_compare_dense_reports_token_agreement():
    r = turbokv("generate", "--prompt", "import os", "--max-tokens", "16", "--kv-bits", "3.5",
                "--compare-dense", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["tokens"] == 16
    assert 0 <= out["agreeing_tokens"] <= 16
    assert 0 <= out["teacher_forced_agreeing_tokens"] <= 16
    assert out["kv"]["kv_scheme"] == "turboquant"


def test_chat_keeps_history_clears_and_exits():
    r = turbokv("chat", "--max-tokens", "8", stdin="hello\n/clear\nwrite code\n/exit\nnever\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("\n") == 2  # two replies, nothing after /exit


def test_padded_vocab_model_samples_only_tokenizer_ids():
    # Sampling at a high temperature would draw a padded id (257..511) within a few tokens.
    r = turbokv("generate", "--model", PADDED, "--prompt", "hello", "--temperature", "1.5",
                "--max-tokens", "200", "--ignore-eos", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["generated_tokens"] == 200


def nested(depth):
    return "[" * depth + "1" + "]" * depth


def test_deeply_nested_template_vars_are_a_format_error(tmp_path):
    vars_path = tmp_path / "vars.json"
    vars_path.write_text('{"messages": ' + nested(100000) + "}")
    r = turbokv("template", "--vars", str(vars_path))
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "deeper than" in r.stderr and "vars.json" in r.stderr


@pytest.mark.parametrize("file, key", [
    ("config.json", "num_hidden_layers"), ("config.json", "eos_token_id"),
    ("config.json", "hidden_act"), ("generation_config.json", "eos_token_id"),
])
def test_deeply_nested_config_fields_are_a_format_error(tmp_path, file, key):
    model = tmp_path / "model"
    shutil.copytree(os.path.join(ROOT, "tests", "fixtures", "hf-tiny", "llama"), model)
    config = json.loads((model / file).read_text())
    config[key] = "@@"
    (model / file).write_text(json.dumps(config).replace('"@@"', nested(100000)))
    r = turbokv("generate", "--model", str(model), "--prompt", "x", "--max-tokens", "2")
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert file in r.stderr and "deeper than" in r.stderr


@pytest.mark.parametrize("command, flags, named", [
    ("server", ["--port", "99999"], "--port"),
    ("server", ["--port", "-1"], "--port"),
    ("server", ["--max-body-bytes", "-5"], "--max-body-bytes"),
    ("server", ["--http-threads", "0"], "--http-threads"),
    ("server", ["--max-sequences", "99999999999"], "--max-sequences"),
    ("generate", ["--threads", "-1"], "--threads"),
    ("generate", ["--seed", "-1"], "--seed"),
    ("generate", ["--kv-seed", "-3"], "--kv-seed"),
    ("generate", ["--quantized-kv-start", "99999999999999999999"], "--quantized-kv-start"),
    ("generate", ["--kv-group-size", "1099511627776"], "--kv-group-size"),
])
def test_integer_flags_out_of_range_exit_2_naming_the_flag(command, flags, named):
    args = [command, *flags] + (["--prompt", "x"] if command == "generate" else [])
    r = turbokv(*args)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert named in r.stderr
