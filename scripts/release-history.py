#!/usr/bin/env python3
"""Builds a git repository whose first-parent history is a Python project's
releases, one commit per release, oldest first — for `cachet context replay`
on a public repository of another language when its git host is out of reach.

The default project, Hypothesis, publishes a release for every pull request it
merges, so its release history is close to its first-parent history on master.

    scripts/release-history.py --package hypothesis --releases 301 --out target/replay/hypothesis

Downloads each release's pure-Python wheel (its source, without the build
metadata) with the ordinary `pip download` (cached beside the output), unpacks
it into the work tree and commits it. Nothing of this
goes into cachet's repository.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path


def versions(package: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", package],
        check=True, capture_output=True, text=True,
    ).stdout
    for line in out.splitlines():
        if line.startswith("Available versions:"):
            listed = [v.strip() for v in line.split(":", 1)[1].split(",")]
            return [v for v in listed if v and all(p.isdigit() for p in v.split("."))]
    raise SystemExit(f"no versions listed for {package}")


def download(package: str, version: str, cache: Path) -> Path | None:
    names = (f"{package.replace('-', '_')}-{version}-", f"{package}-{version}-")
    for f in cache.iterdir():
        if f.name.startswith(names) and f.suffix == ".whl":
            return f
    # Pure-Python wheels carry the package's source and need no build step
    # (downloading an sdist makes pip build its metadata).
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "-q", "-d", str(cache), f"{package}=={version}"]
    if subprocess.run(cmd, capture_output=True).returncode != 0:
        return None
    for f in cache.iterdir():
        if f.name.startswith(names) and f.suffix == ".whl":
            return f
    return None


def unpack(archive: Path, dest: Path) -> None:
    tmp = dest.parent / ".unpack"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    if archive.suffix in (".zip", ".whl"):
        with zipfile.ZipFile(archive) as z:
            z.extractall(tmp)
    else:
        with tarfile.open(archive) as t:
            t.extractall(tmp, filter="data")
    entries = [e for e in tmp.iterdir() if not e.name.endswith((".dist-info", ".data"))]
    for entry in dest.iterdir():
        if entry.name != ".git":
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    for entry in entries:
        shutil.move(str(entry), dest / entry.name)
    shutil.rmtree(tmp)


def git(dest: Path, *args: str, env=None) -> None:
    subprocess.run(["git", "-C", str(dest), *args], check=True, capture_output=True, env=env)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--package", default="hypothesis")
    ap.add_argument("--releases", type=int, default=301)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    wanted = list(reversed(versions(args.package)[: args.releases]))
    cache = args.out.parent / f".wheels-{args.package}"
    cache.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    git(args.out, "init", "-q", "-b", "main")
    for i, version in enumerate(wanted):
        archive = download(args.package, version, cache)
        if archive is None:
            print(f"skip {version}: no wheel", file=sys.stderr)
            continue
        unpack(archive, args.out)
        git(args.out, "add", "-A")
        stamp = f"{1_700_000_000 + i * 3600} +0000"
        env = dict(os.environ, GIT_AUTHOR_NAME="release", GIT_AUTHOR_EMAIL="release@localhost",
                   GIT_COMMITTER_NAME="release", GIT_COMMITTER_EMAIL="release@localhost",
                   GIT_AUTHOR_DATE=stamp, GIT_COMMITTER_DATE=stamp)
        git(args.out, "commit", "-q", "--allow-empty", "-m", f"{args.package} {version}", env=env)
        print(f"[{i + 1}/{len(wanted)}] {version}", flush=True)


if __name__ == "__main__":
    main()
