#!/usr/bin/env python3
"""Checks the dependency rules between the libraries of the source tree.

The rules are the Layers table of docs/design.md (between the `layers-table` markers): one row
per library (a folder under src/ with a CMakeLists.txt, plus `include` and `bench`) naming the
libraries it may include. Every `#include "..."` line of every source file under src/, include/
and bench/ is checked against it:
  - "turbokv/..." (the public headers) may be included from anywhere;
  - a library may include its own headers;
  - anything else must belong to a library named in the including library's row.
The table itself must name every library folder, only known libraries, and have no cycle.

usage: scripts/check_layers.py [--root REPO]    exit 0 when every rule holds, 1 otherwise
       scripts/check_layers.py --self-test      checks that a forbidden edge is reported
"""
import argparse
import os
import re
import sys
import tempfile

SOURCE_SUFFIXES = (".h", ".hpp", ".cc", ".cpp", ".cu", ".cuh")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
TABLE_BEGIN = "<!-- layers-table"
TABLE_END = "<!-- end layers-table"


def parse_rules(design_md):
    """{library: set of libraries it may include} from the Layers table of design.md."""
    with open(design_md, encoding="utf-8") as f:
        text = f.read()
    begin = text.find(TABLE_BEGIN)
    end = text.find(TABLE_END)
    if begin < 0 or end < begin:
        raise SystemExit(f"{design_md}: no layers table between '{TABLE_BEGIN}' and '{TABLE_END}'")
    rules = {}
    for line in text[begin:end].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue  # the marker, the header, the separator row
        library = cells[0].strip("`")
        allowed = cells[2]
        deps = set() if allowed in ("—", "-", "") else {d.strip() for d in allowed.split(",")}
        if library in rules:
            raise SystemExit(f"{design_md}: library '{library}' has two rows")
        rules[library] = deps
    return rules


def check_table(rules, root):
    errors = []
    for library, deps in sorted(rules.items()):
        for dep in sorted(deps):
            if dep not in rules:
                errors.append(f"layers table: '{library}' may include '{dep}', which has no row")
    src = os.path.join(root, "src")
    for dirpath, _, files in os.walk(src):
        if "CMakeLists.txt" in files and dirpath != src:
            library = os.path.relpath(dirpath, src).replace(os.sep, "/")
            if library not in rules:
                errors.append(f"layers table: library folder src/{library} has no row")
    # No cycle: a depth-first walk that meets a library on its own path is one.
    state = {}

    def visit(library, path):
        if state.get(library) == "done":
            return
        if state.get(library) == "open":
            cycle = path[path.index(library):] + [library]
            errors.append("layers table: cycle " + " -> ".join(cycle))
            return
        state[library] = "open"
        for dep in sorted(rules.get(library, ())):
            visit(dep, path + [library])
        state[library] = "done"

    for library in sorted(rules):
        visit(library, [])
    return errors


def library_of_src_path(path, rules):
    """The library of a path relative to src/: its longest listed folder prefix."""
    parts = path.split("/")[:-1]
    for n in range(len(parts), 0, -1):
        candidate = "/".join(parts[:n])
        if candidate in rules:
            return candidate
    return None


def check_includes(rules, root):
    errors = []
    for top in ("src", "include", "bench"):
        base = os.path.join(root, top)
        for dirpath, _, files in os.walk(base):
            for name in sorted(files):
                if not name.endswith(SOURCE_SUFFIXES):
                    continue
                file_path = os.path.join(dirpath, name)
                rel = os.path.relpath(file_path, root).replace(os.sep, "/")
                if top == "src":
                    library = library_of_src_path(rel[len("src/"):], rules)
                else:
                    library = top
                if library is None:
                    errors.append(f"{rel}: not inside any library of the layers table")
                    continue
                with open(file_path, encoding="utf-8", errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        m = INCLUDE_RE.match(line)
                        if not m:
                            continue
                        error = check_one(rules, root, library, dirpath, m.group(1))
                        if error:
                            errors.append(f"{rel}:{number}: {error}")
    return errors


def check_one(rules, root, library, dirpath, target):
    if target.startswith("turbokv/"):
        return None
    if os.path.exists(os.path.join(dirpath, target)) and "/" not in target:
        return None  # a header next to the file: the same library
    if library == "include":
        return f'public headers include only "turbokv/..." headers, not "{target}"'
    if not os.path.exists(os.path.join(root, "src", target)):
        return f'"{target}" is not a file under src/ (project includes are relative to src/)'
    target_library = library_of_src_path(target, rules)
    if target_library is None:
        return f'"{target}" is not inside any library of the layers table'
    if target_library == library or target_library in rules[library]:
        return None
    allowed = ", ".join(sorted(rules[library])) or "nothing but itself"
    return (f'{library} may not include {target_library} ("{target}"); '
            f"{library} may include: {allowed} (docs/design.md, \"Layers\")")


def run(root):
    rules = parse_rules(os.path.join(root, "docs", "design.md"))
    errors = check_table(rules, root) + check_includes(rules, root)
    for e in errors:
        print(e, file=sys.stderr)
    if not errors:
        print(f"layers: {len(rules)} libraries, every include follows docs/design.md")
    return 1 if errors else 0


def self_test():
    """A tiny tree with one allowed and one forbidden edge: only the forbidden one is reported."""
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "docs"))
        for folder in ("src/core", "src/kv", "include/turbokv", "bench"):
            os.makedirs(os.path.join(root, folder))
        with open(os.path.join(root, "docs", "design.md"), "w") as f:
            f.write("<!-- layers-table -->\n| library | what | may include |\n|---|---|---|\n"
                    "| `core` | base | — |\n| `kv` | caches | core |\n"
                    "| `include` | api | — |\n| `bench` | benchmarks | core, kv |\n"
                    "<!-- end layers-table -->\n")
        files = {
            "src/core/CMakeLists.txt": "",
            "src/kv/CMakeLists.txt": "",
            "src/core/a.h": '#include "turbokv/api.h"\n',
            "src/core/b.cc": '#include "core/a.h"\n#include "kv/c.h"\n',  # forbidden
            "src/kv/c.h": '#include "core/a.h"\n#include "d.h"\n',
            "src/kv/d.h": "",
            "include/turbokv/api.h": "",
        }
        for path, text in files.items():
            with open(os.path.join(root, path), "w") as f:
                f.write(text)
        rules = parse_rules(os.path.join(root, "docs", "design.md"))
        errors = check_table(rules, root) + check_includes(rules, root)
        expected = ["src/core/b.cc:2: core may not include kv"]
        ok = len(errors) == 1 and errors[0].startswith(expected[0])
        rules["core"].add("kv")  # and a cycle core -> kv -> core is reported
        cycle = [e for e in check_table(rules, root) if "cycle" in e]
        ok = ok and len(cycle) == 1
        print("self-test:", "ok" if ok else f"FAILED: {errors} {cycle}")
        return 0 if ok else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    return self_test() if args.self_test else run(os.path.abspath(args.root))


if __name__ == "__main__":
    sys.exit(main())
