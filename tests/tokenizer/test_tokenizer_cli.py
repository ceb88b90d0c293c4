"""`turbokv tokenize` and `turbokv template` (docs/design.md, "Contracts") against the HF fixtures: JSON output,
exit codes and error messages on stderr."""
import json
import os
import subprocess
import tempfile

import pytest

REPO = os.environ["TURBOKV_SOURCE_DIR"]
BINARY = os.environ["TURBOKV_BINARY"]
FIXTURES = os.path.join(REPO, "tests", "fixtures")


def run(*args):
    return subprocess.run([BINARY, *args], capture_output=True, text=True, timeout=120)


def tokenizer_args(name):
    if name == "tinycode":
        return ["--model", os.path.join(REPO, "models", "tinycode-llama")]
    return ["--tokenizer", os.path.join(FIXTURES, "tokenizers", f"{name}-tokenizer.json")]


@pytest.mark.parametrize("name", ["tinycode", "llama3style", "spmstyle"])
def test_tokenize_json_ids_equal_hf(name):
    with open(os.path.join(FIXTURES, "tokenizers", "tokenizer-cases.json")) as f:
        cases = json.load(f)[name]
    for case in cases[:8]:
        result = run("tokenize", *tokenizer_args(name), "--text", case["text"], "--json")
        assert result.returncode == 0, result.stderr
        out = json.loads(result.stdout)
        assert out["ids"] == case["ids"], case["text"]
        assert len(out["tokens"]) == len(case["ids"])


def write(directory, name, text):
    path = os.path.join(directory, name)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def test_template_renders_fixture_and_raises():
    with open(os.path.join(FIXTURES, "chat-templates.json"), encoding="utf-8") as f:
        fixture = json.load(f)
    with tempfile.TemporaryDirectory() as tmp:
        for case in fixture["cases"]:
            if case["template"] != "chatml_tools":
                continue
            template = write(tmp, "t.jinja", fixture["templates"][case["template"]])
            variables = {"messages": fixture["conversations"][case["conversation"]],
                         "add_generation_prompt": case["add_generation_prompt"],
                         "bos_token": fixture["bos_token"], "eos_token": fixture["eos_token"],
                         **case["extra"]}
            vars_path = write(tmp, "vars.json", json.dumps(variables))
            result = run("template", "--template", template, "--vars", vars_path, "--json")
            if "error" in case:
                assert result.returncode == 1
                assert case["error"] in result.stderr
            else:
                assert result.returncode == 0, result.stderr
                assert json.loads(result.stdout)["text"] == case["output"]
        template = write(tmp, "raise.jinja", "{{ raise_exception('no ' + messages[0].role) }}")
        vars_path = write(tmp, "vars.json", json.dumps({"messages": [{"role": "user"}]}))
        result = run("template", "--template", template, "--vars", vars_path)
        assert result.returncode == 1 and "no user" in result.stderr


def test_model_template_and_errors():
    with tempfile.TemporaryDirectory() as tmp:
        vars_path = write(tmp, "vars.json", json.dumps(
            {"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": True}))
        result = run("template", "--vars", vars_path, "--json")
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["text"] == (
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")

        bad_template = write(tmp, "bad.jinja", "line 1\n{% if %}")
        result = run("template", "--template", bad_template, "--vars", vars_path)
        assert result.returncode == 1 and "template syntax error at 2:7" in result.stderr

        bad_json = write(tmp, "tokenizer.json", '{"model": {"vocab": {"a" 1}}}')
        result = run("tokenize", "--tokenizer", bad_json, "--text", "x")
        assert result.returncode == 1
        assert "malformed JSON at byte 25 (line 1, column 26)" in result.stderr

    assert run("template").returncode == 2  # --vars is required
    assert run("tokenize").returncode == 2  # --text or --file is required
