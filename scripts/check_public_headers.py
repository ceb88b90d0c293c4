#!/usr/bin/env python3
"""Checks that every public header include/turbokv/*.h compiles on its own: a translation unit
that includes only that header (twice, for the include guard), compiled with only include/ on
the include path and warnings as errors.

usage: scripts/check_public_headers.py [--root REPO] [--cxx COMPILER]   exit 1 on any failure
"""
import argparse
import glob
import os
import subprocess
import sys
import tempfile


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    parser.add_argument("--cxx", default=os.environ.get("CXX", "c++"))
    args = parser.parse_args()
    include = os.path.join(os.path.abspath(args.root), "include")
    headers = sorted(glob.glob(os.path.join(include, "turbokv", "*.h")))
    if not headers:
        print(f"no headers under {include}/turbokv", file=sys.stderr)
        return 1
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for header in headers:
            name = "turbokv/" + os.path.basename(header)
            tu = os.path.join(tmp, "tu.cc")
            with open(tu, "w") as f:
                f.write(f'#include "{name}"\n#include "{name}"\n')
            # -nostdinc++ is not used: the standard library is allowed, nothing else is.
            cmd = [args.cxx, "-std=c++20", "-fsyntax-only", "-Wall", "-Wextra", "-Werror",
                   "-I", include, tu]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                failed += 1
                print(f"{name}: does not compile alone with only include/ on the path:\n"
                      f"{r.stderr}", file=sys.stderr)
            else:
                print(f"{name}: ok")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
