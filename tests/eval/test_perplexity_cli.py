"""`turbokv perplexity` and `turbokv bench e2e` through the built binary: the JSON contract (docs/design.md, "Contracts")
keys, the dense baseline inside a quantized run, exit codes and error lines."""
import json
import math
import os
import subprocess
import tempfile

import pytest

REPO = os.environ["TURBOKV_SOURCE_DIR"]
BINARY = os.environ["TURBOKV_BINARY"]
MODEL = os.path.join(REPO, "models", "tinycode-llama")
CODE = '''def fibonacci(n):
    """Return the n-th Fibonacci number."""
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        return self.items.pop()
'''


def run(*args):
    return subprocess.run([BINARY, *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def text_file():
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "code.py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(CODE * 3)
        yield path


def perplexity(text_file, *flags):
    result = run("perplexity", "--model", MODEL, "--file", text_file, "--context", "64",
                 "--max-chunks", "2", "--threads", "2", "--json", *flags)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_dense_reports_ppl_and_tokens(text_file):
    out = perplexity(text_file)
    assert out["tokens"] == 128 and out["chunks"] == 2
    assert 1 < out["ppl"] < 100 and math.isfinite(out["ppl"])
    assert "kld_mean" not in out


@pytest.mark.parametrize("flags,scheme", [(["--kv-bits", "3.5"], "turboquant"),
                                          (["--kv-bits", "4", "--kv-quant-scheme", "uniform"],
                                           "uniform")])
def test_kv_scheme_reports_dense_baseline_kld_and_agreement(text_file, flags, scheme):
    dense = perplexity(text_file)
    out = perplexity(text_file, *flags)
    assert out["kv_scheme"] == scheme and out["tokens"] == 128
    assert out["ppl_dense"] == pytest.approx(dense["ppl"], rel=1e-5)
    assert 0 < out["kld_mean"] < 0.5
    assert 0.5 < out["top1_agreement"] <= 1
    assert out["ppl"] != out["ppl_dense"]


def test_sweep_scores_each_setting_as_a_single_run(text_file, tmp_path):
    settings = ["--kv-bits 3.5",
                "--kv-bits 3.5 --kv-centering both --kv-sink-tokens 4 --quantize-last-layer",
                "--kv-bits 4  # uniform groups of 64",
                "--kv-bits 4 --kv-hadamard --kv-layer-bits 0:dense"]
    sweep = tmp_path / "sweep.txt"
    sweep.write_text("# one setting per line\n\n" + "\n".join(settings) + "\n")
    csv_path, json_path = tmp_path / "table.csv", tmp_path / "table.json"
    out = perplexity(text_file, "--sweep", str(sweep), "--csv", str(csv_path), "--json-out",
                     str(json_path))
    rows = out["settings"]
    assert [r["setting"] for r in rows] == [s.split("#")[0].strip() for s in settings]
    assert json.loads(json_path.read_text()) == rows
    lines = csv_path.read_text().splitlines()
    assert lines[0].startswith("setting,kv_scheme,kv_bits_effective") and len(lines) == 5
    for setting, row in zip(settings, rows):
        single = perplexity(text_file, *setting.split("#")[0].split())
        assert row["kld_mean"] == pytest.approx(single["kld_mean"], rel=1e-4, abs=1e-7)
        assert row["ppl"] == pytest.approx(single["ppl"], rel=1e-5)
        assert row["kv_bits_effective"] == single["kv_bits_effective"]
        assert row["kv_bits_quantized_layers"] == single["kv_bits_quantized_layers"]
    # Whole-model bits count the dense last layer (fp16) of the default: 5 of 6 layers coded.
    assert rows[0]["kv_bits_effective"] == pytest.approx(
        (5 * rows[0]["kv_bits_quantized_layers"] + 16) / 6)
    # Every layer coded: the two numbers agree.
    assert rows[1]["kv_bits_effective"] == rows[1]["kv_bits_quantized_layers"]
    bad = tmp_path / "bad.txt"
    for text, needle in [("--kv-bits 3.5 --kv-centering sideways\n", "line 1"),
                         ("\n# nothing\n", "no settings"),
                         ("--kv-bits 4 --kv-sink-tokens 4\n", "kv_sink_tokens")]:
        bad.write_text(text)
        result = run("perplexity", "--model", MODEL, "--file", text_file, "--sweep", str(bad))
        assert result.returncode == 2 and needle in result.stderr, result.stderr


def test_errors_are_one_line_with_exit_codes(text_file):
    bad_bits = run("perplexity", "--model", MODEL, "--file", text_file, "--kv-bits", "3.3")
    assert bad_bits.returncode == 2 and "3.3" in bad_bits.stderr
    missing = run("perplexity", "--model", MODEL, "--file", "/nonexistent/eval.txt")
    assert missing.returncode == 1 and "/nonexistent/eval.txt" in missing.stderr
    too_short = run("perplexity", "--model", MODEL, "--file", text_file, "--context", "100000")
    assert too_short.returncode == 2 and "100000" in too_short.stderr
    for result in (bad_bits, missing, too_short):
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_bench_e2e_json():
    result = run("bench", "e2e", "--prompt-tokens", "16", "--gen-tokens", "4", "--repeats", "1",
                 "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert [r["kv"] for r in out["results"]] == ["dense", "turboquant"]
    for row in out["results"]:
        assert row["prefill_tps"] > 0 and row["decode_tps"] > 0
    assert out["results"][1]["kv_bytes"] < out["results"][0]["kv_bytes"]
