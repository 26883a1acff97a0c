#!/usr/bin/env python3
"""The module index at the end of docs/structures.md: every Rust module of every crate with the
first sentence of its `//!` overview, so that the document names every module there is.

    scripts/module_index.py          rewrite the index in place
    scripts/module_index.py --check  fail if the index is stale, or if the prose above it names
                                     a `.rs` file that does not exist (scripts/test.sh runs this)
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
DOC = os.path.join(ROOT, "docs", "structures.md")
CRATES = ["words", "kernels", "engine", "context", "tenants", "api", "bench", "tests"]
START, END = "<!-- module-index:start -->", "<!-- module-index:end -->"


def overview(path):
    """The first sentence of a file's `//!` block (None without one)."""
    lines = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            s = line.strip()
            if not s.startswith("//!"):
                break
            s = s[3:].strip()
            if not s:
                if lines:
                    break
                continue
            lines.append(s)
    if not lines:
        return None
    text = " ".join(lines)
    m = re.search(r"(?<!e\.g)(?<!i\.e)(?<!etc)[.;](\s|$)", text)
    sentence = text[: m.start()] if m else text
    return sentence if len(sentence) <= 150 else sentence[:149].rstrip() + "…"


def modules():
    """(crate, path under the crate, overview) of every module file, tests left out."""
    out = []
    for crate in CRATES:
        src = os.path.join(ROOT, crate, "src")
        if not os.path.isdir(src):
            continue
        for dirpath, dirnames, filenames in os.walk(src):
            dirnames.sort()
            for name in sorted(filenames):
                if not name.endswith(".rs"):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, name), os.path.join(ROOT, crate))
                parts = rel.split(os.sep)
                if name in ("tests.rs", "proptests.rs") or name.endswith("_tests.rs") or "tests" in parts[:-1]:
                    continue
                out.append((crate, "/".join(parts), overview(os.path.join(dirpath, name))))
    return out


def index():
    lines = [
        START,
        "",
        "## Module index",
        "",
        "Every module, with the first sentence of its overview (written by `scripts/module_index.py`;",
        "`scripts/test.sh` fails when it is stale).",
        "",
    ]
    crate = None
    for c, path, text in modules():
        if c != crate:
            if crate is not None:
                lines.append("")
            lines.append(f"`{c}/`")
            lines.append("")
            crate = c
        lines.append(f"- `{path}` — {text or '(no overview)'}")
    lines += ["", END]
    return "\n".join(lines) + "\n"


def named_files_missing(prose):
    """`.rs` files the prose names that exist nowhere in the crates."""
    files = set()
    for crate in CRATES:
        for dirpath, _, filenames in os.walk(os.path.join(ROOT, crate)):
            if "/target" in dirpath:
                continue
            for n in filenames:
                if n.endswith(".rs"):
                    files.add(os.path.relpath(os.path.join(dirpath, n), ROOT).replace(os.sep, "/"))
    missing = []
    for name in sorted(set(re.findall(r"[\w/]+\.rs\b", prose))):
        if not any(f == name or f.endswith("/" + name) for f in files):
            missing.append(name)
    return missing


def main():
    doc = open(DOC, encoding="utf-8").read()
    prose = doc.split(START)[0].rstrip("\n") + "\n"
    new = prose + "\n" + index()
    if "--check" in sys.argv[1:]:
        bad = False
        if new != doc:
            print("docs/structures.md: the module index is stale (run scripts/module_index.py)", file=sys.stderr)
            bad = True
        missing = named_files_missing(prose)
        if missing:
            print("docs/structures.md names files that do not exist: " + ", ".join(missing), file=sys.stderr)
            bad = True
        no_doc = [f"{c}/{p}" for c, p, t in modules() if t is None]
        if no_doc:
            print("modules without a //! overview: " + ", ".join(no_doc), file=sys.stderr)
            bad = True
        sys.exit(1 if bad else 0)
    with open(DOC, "w", encoding="utf-8") as f:
        f.write(new)


if __name__ == "__main__":
    main()
