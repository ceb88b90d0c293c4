#!/usr/bin/env python3
"""Checks that README.md and the docs stay true to the code.

README commands (every line of a ```sh block, and every `build/...`, `scripts/...` or
`python3 ...` span in the README's text and tables):
  - `build/turbokv CMD [SUB] --flag ...`: CMD (and SUB for `bench`) is a command of the binary
    and every flag is listed by `turbokv CMD [SUB] --help`;
  - every path into the repository (models/, tests/, scripts/, bench/, docs/, include/, src/)
    exists; `build/...` paths exist in the build folder. Upper-case names (EVAL.txt) stand for
    data the README says it does not ship and are not checked;
  - with --run, the cheap commands are run for real and must exit 0: `generate` with at most 64
    tokens (not with `--device cuda`), `tokenize`, `template`, and the Python one-liners; so are
    the ```python examples;
  - the ```cpp examples compile (syntax only) with only include/ on the include path.
The commands of docs/*.md (```sh blocks) are checked the same way, not run.
Links: every relative link of README.md and docs/*.md names an existing file, and its #anchor
a heading of that file.
Code references: every `docs/NAME.md, "Section"` in src/, include/, bench/, tests/, scripts/,
cmake/ and CMakeLists.txt names an existing document and a heading of it.

usage: scripts/check_readme.py --build BUILD_DIR [--root REPO] [--run] [--cxx COMPILER]   exit 1 on any failure
"""
import argparse
import functools
import os
import re
import shlex
import subprocess
import sys
import tempfile

REPO_DIRS = ("models/", "tests/", "scripts/", "bench/", "docs/", "include/", "src/", "cmake/")
CODE_DIRS = ("src", "include", "bench", "tests", "scripts", "cmake")
CODE_SUFFIXES = (".h", ".cc", ".cu", ".cuh", ".py", ".sh", ".mjs", ".txt", ".cmake")


class Checker:
    def __init__(self, root, build, run):
        self.root, self.build, self.run = root, build, run
        self.errors = []
        self.commands = 0
        self.ran = 0

    def error(self, where, message):
        if f"{where}: {message}" not in self.errors:
            self.errors.append(f"{where}: {message}")

    # ---- README commands ----

    def commands_of(self, name, spans=True):
        """(line number, command) for every command line of a Markdown file: the lines of its
        ```sh blocks (here-documents skipped) and, with spans, its command-like `spans`."""
        lines = open(os.path.join(self.root, name), encoding="utf-8").read().split("\n")
        out = []
        in_sh = False
        heredoc = None
        pending, start = "", 0
        for number, line in enumerate(lines, 1):
            if heredoc is not None:
                if line.strip() == heredoc:
                    heredoc = None
                continue
            if line.startswith("```"):
                in_sh = line.strip() in ("```sh", "```bash")
                continue
            if in_sh:
                m = re.search(r"<<-?\s*'?\"?(\w+)'?\"?", line)
                if m:
                    heredoc = m.group(1)
                    line = line[:m.start()]
                if not pending:
                    start = number
                if line.rstrip().endswith("\\"):
                    pending += line.rstrip()[:-1] + " "
                    continue
                command = (pending + line).strip()
                pending = ""
                if command and not command.startswith("#"):
                    out.append((start, command))
                continue
            if not spans:
                continue
            for span in re.findall(r"`([^`]+)`", line):
                if re.match(r"(build/|scripts/|python3 |PYTHONPATH=)", span):
                    out.append((number, span))
        return out

    @functools.lru_cache(maxsize=None)
    def help_text(self, *command):
        binary = os.path.join(self.build, "turbokv")
        r = subprocess.run([binary, *command, "--help"], capture_output=True, text=True,
                           timeout=60)
        return r.returncode, r.stdout + r.stderr

    def subcommands(self, *command):
        _, text = self.help_text(*command)
        return set(re.findall(r"^\s{2}([a-z][a-z-]*)\s", text, re.M))

    def check_command(self, where, command):
        self.commands += 1
        try:
            words = shlex.split(command, comments=True)
        except ValueError as e:
            self.error(where, f"cannot parse `{command}`: {e}")
            return
        simple, current = [], []
        for w in words:
            if w in ("&&", "||", "|", ";", "&"):
                simple.append(current)
                current = []
            else:
                current.append(w)
        simple.append(current)
        for part in simple:
            while part and re.match(r"^[A-Z_]+=", part[0]):
                part = part[1:]
            if part:
                self.check_simple(where, part)
        if self.run and self.is_cheap(words):
            self.run_command(where, command)

    def check_simple(self, where, words):
        program = words[0]
        if program in ("build/turbokv", "turbokv"):
            self.check_turbokv(where, words[1:])
        elif program.startswith("build/"):
            if not os.path.exists(os.path.join(self.build, program[len("build/"):])):
                self.error(where, f"{program} is not built by the build")
        elif program.startswith(REPO_DIRS):
            self.check_path(where, program)
        elif program in ("python3", "node", "bash"):
            for w in words[1:]:
                if not w.startswith("-") and w.startswith(REPO_DIRS):
                    self.check_path(where, w)
        for w in words[1:]:
            if w.startswith(REPO_DIRS) and "/" in w:
                self.check_path(where, w)
            elif w.startswith("build/") and "/" in w[len("build/"):]:
                if not os.path.exists(os.path.join(self.build, w[len("build/"):])):
                    # The CUDA benchmark library exists only in builds with nvcc.
                    if "cuda" not in w:
                        self.error(where, f"{w} is not in the build folder")

    def check_path(self, where, path):
        path = path.split("#")[0]
        if re.search(r"/[A-Z][A-Z0-9_]*(\.[a-z]+)?$", path):
            return  # a placeholder for data the README names
        if not os.path.exists(os.path.join(self.root, path)):
            self.error(where, f"{path} does not exist in the repository")

    def check_turbokv(self, where, args):
        if not args:
            return
        command = [args[0]]
        if args[0] not in self.subcommands():
            self.error(where, f"`turbokv {args[0]}` is not a command of the binary")
            return
        rest = args[1:]
        if args[0] == "bench" and rest and not rest[0].startswith("-"):
            if rest[0] not in self.bench_kinds():
                self.error(where, f"`turbokv bench {rest[0]}` is not a benchmark")
                return
            command.append(rest[0])
            rest = rest[1:]
        rc, text = self.help_text(*command)
        if rc != 0:
            self.error(where, f"`turbokv {' '.join(command)} --help` exits {rc}")
            return
        for w in rest:
            if w.startswith("--"):
                flag = w.split("=")[0]
                if not re.search(re.escape(flag) + r"(?![a-z-])", text):
                    self.error(where, f"`turbokv {' '.join(command)}` has no flag {flag}")

    def bench_kinds(self):
        _, text = self.help_text()
        m = re.search(r"bench\s+\S.*\(([^)]*)\)", text)
        return {k.strip() for k in m.group(1).split(",")} if m else set()

    # ---- running the cheap commands ----

    def is_cheap(self, words):
        if any(w in ("&&", "|", ";", "&") for w in words):
            return False
        args = [w for w in words if not re.match(r"^[A-Z_]+=", w)]
        if args[:1] == ["python3"] and "-c" in args:
            return True
        if args[:1] != ["build/turbokv"] or len(args) < 2:
            return False
        if "--device" in args and "cuda" in args:
            return False  # needs a GPU; its flags are still checked
        if args[1] in ("tokenize", "template"):
            return True
        if args[1] == "generate" and "--prompt-cache" not in args and "--continue" not in args:
            if "--max-tokens" in args:
                return int(args[args.index("--max-tokens") + 1]) <= 64
        return False

    def run_command(self, where, command):
        env = dict(os.environ)
        words = shlex.split(command)
        while words and re.match(r"^[A-Z_]+=", words[0]):
            name, value = words.pop(0).split("=", 1)
            env[name] = value.replace("build/", self.build + "/", 1) if value.startswith(
                "build/") else value
        words = [self.build + w[len("build"):] if w.startswith("build/") else w for w in words]
        r = subprocess.run(words, cwd=self.root, env=env, capture_output=True, text=True,
                           timeout=300)
        self.ran += 1
        if r.returncode != 0:
            self.error(where, f"`{command}` exits {r.returncode}: {r.stderr.strip()[-400:]}")

    # ---- links and references ----

    @functools.lru_cache(maxsize=None)
    def anchors(self, path):
        text = open(path, encoding="utf-8").read()
        text = re.sub(r"```.*?```", "", text, flags=re.S)
        out = set()
        for heading in re.findall(r"^#+\s+(.*)$", text, re.M):
            slug = heading.strip().lower()
            slug = re.sub(r"[^\w\- ]", "", slug).replace(" ", "-")
            out.add(slug)
        return out

    @functools.lru_cache(maxsize=None)
    def headings(self, path):
        text = open(path, encoding="utf-8").read()
        text = re.sub(r"```.*?```", "", text, flags=re.S)
        return {h.strip() for h in re.findall(r"^#+\s+(.*)$", text, re.M)}

    def check_links(self):
        docs = os.path.join(self.root, "docs")
        files = [os.path.join(self.root, "README.md")]
        if os.path.isdir(docs):
            files += sorted(os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md"))
        for md in files:
            rel = os.path.relpath(md, self.root)
            text = open(md, encoding="utf-8").read()
            for number, line in enumerate(text.split("\n"), 1):
                for target in re.findall(r"\]\(([^)\s]+)\)", line):
                    if re.match(r"[a-z]+://", target):
                        continue
                    path, _, anchor = target.partition("#")
                    full = os.path.normpath(os.path.join(os.path.dirname(md), path)) if path else md
                    if not os.path.exists(full):
                        self.error(f"{rel}:{number}", f"link to {target}: no such file")
                    elif anchor and full.endswith(".md") and anchor not in self.anchors(full):
                        self.error(f"{rel}:{number}", f"link to {target}: no such heading")

    def code_blocks(self, name, language):
        """(line number, text) of every ```language block of a Markdown file."""
        text = open(os.path.join(self.root, name), encoding="utf-8").read()
        out = []
        for m in re.finditer(r"^```" + language + r"\n(.*?)^```", text, re.S | re.M):
            out.append((text[:m.start()].count("\n") + 1, m.group(1)))
        return out

    def check_python_blocks(self):
        """Runs each ```python block of README.md, in a scratch folder where models/ is the
        repository's (files the example writes stay there)."""
        for number, code in self.code_blocks("README.md", "python"):
            with tempfile.TemporaryDirectory() as scratch:
                os.symlink(os.path.join(self.root, "models"), os.path.join(scratch, "models"))
                env = dict(os.environ, PYTHONPATH=os.path.join(self.build, "python"))
                r = subprocess.run([sys.executable, "-c", code], cwd=scratch, env=env,
                                   capture_output=True, text=True, timeout=300)
                self.ran += 1
                if r.returncode != 0:
                    self.error(f"README.md:{number}",
                               f"the Python example fails: {r.stderr.strip()[-400:]}")

    def check_cpp_blocks(self, cxx):
        """Compiles each ```cpp block of README.md (its #include lines first, the rest as the
        body of main) with only include/ on the include path."""
        for number, code in self.code_blocks("README.md", "cpp"):
            lines = code.split("\n")
            includes = [l for l in lines if l.startswith("#include")]
            body = [l for l in lines if not l.startswith("#include")]
            tu = "\n".join(["#include <cstdio>"] + includes + ["int main() {"] + body +
                           ["return 0;", "}"])
            with tempfile.TemporaryDirectory() as scratch:
                path = os.path.join(scratch, "example.cc")
                with open(path, "w") as f:
                    f.write(tu)
                r = subprocess.run([cxx, "-std=c++20", "-fsyntax-only", "-I",
                                    os.path.join(self.root, "include"), path],
                                   capture_output=True, text=True, timeout=120)
                if r.returncode != 0:
                    self.error(f"README.md:{number}",
                               f"the C++ example does not compile: {r.stderr.strip()[-600:]}")

    def check_code_references(self):
        paths = [os.path.join(self.root, "CMakeLists.txt")]
        for top in CODE_DIRS:
            for dirpath, dirs, files in os.walk(os.path.join(self.root, top)):
                dirs[:] = [d for d in dirs if d not in ("node_modules", "fixtures")]
                paths += [os.path.join(dirpath, f) for f in files if f.endswith(CODE_SUFFIXES)]
        for path in sorted(paths):
            rel = os.path.relpath(path, self.root)
            text = open(path, encoding="utf-8", errors="replace").read()
            # Join comment continuation lines so that a section name may wrap.
            joined = re.sub(r"\n\s*(//|#|\*)?\s*", " ", text)
            for doc in set(re.findall(r"docs/([a-z][\w-]*\.md)", text)):
                if not os.path.exists(os.path.join(self.root, "docs", doc)):
                    self.error(rel, f"refers to docs/{doc}, which does not exist")
            for doc, section in re.findall(r'docs/([\w-]+\.md),\s*"([^"]+)"', joined):
                full = os.path.join(self.root, "docs", doc)
                if os.path.exists(full) and section not in self.headings(full):
                    self.error(rel, f'refers to docs/{doc}, "{section}": no such section')


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    parser.add_argument("--build", required=True, help="the build folder (has turbokv)")
    parser.add_argument("--run", action="store_true", help="also run the cheap commands")
    parser.add_argument("--cxx", default=os.environ.get("CXX", "c++"), help="for the C++ example")
    args = parser.parse_args()
    c = Checker(os.path.abspath(args.root), os.path.abspath(args.build), args.run)
    for number, command in c.commands_of("README.md"):
        c.check_command(f"README.md:{number}", command)
    # The docs' commands are checked the same way but not run (they are the long measurements).
    run, c.run = c.run, False
    docs = os.path.join(c.root, "docs")
    for name in sorted(os.listdir(docs)) if os.path.isdir(docs) else []:
        if name.endswith(".md"):
            for number, command in c.commands_of(f"docs/{name}", spans=False):
                c.check_command(f"docs/{name}:{number}", command)
    c.run = run
    if c.run:
        c.check_python_blocks()
    c.check_cpp_blocks(args.cxx)
    c.check_links()
    c.check_code_references()
    for e in c.errors:
        print(e, file=sys.stderr)
    print(f"README: {c.commands} commands checked, {c.ran} run; {len(c.errors)} problems")
    return 1 if c.errors else 0


if __name__ == "__main__":
    sys.exit(main())
