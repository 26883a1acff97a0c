"""Multi-file agent tasks made from a real repository's history (docs/benchmarks.md, "Repository
tasks"): a commit that adds a small feature or fixes a bug together with its tests becomes a task —
the repository at the commit's parent (with no history after it), the commit message as the task,
success when the commit's test files pass afterwards. No code of the repository is kept in cachet:
a task list holds commit ids and messages, and the code is read from a local clone at run time.

    python scripts/repo_tasks.py select --git DIR --out bench/repo-tasks/NAME.json [--limit 12] [--name URL]
        picks the newest commits that change both source and test files (at most --max-lines
        changed lines), and keeps those whose tests fail at the parent and pass at the commit
    python scripts/repo_tasks.py check --git DIR --tasks FILE
        checks a task list again (each task fails at its parent and passes at its commit)

The test command runs the commit's changed test files with `python -m unittest` (test modules
under `tests/`, as more-itertools has them).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile


def git(repo, *args, check=True):
    return subprocess.run(["git", "-C", repo, *args], check=check, capture_output=True, text=True).stdout


def is_test(path):
    name = os.path.basename(path)
    return path.endswith(".py") and (path.startswith("tests/") or name.startswith("test_"))


def candidates(repo, max_lines, scan):
    """Newest first: (commit, parent, message, source files, test files)."""
    for line in git(repo, "log", "--no-merges", f"-n{scan}", "--format=%H %P").splitlines():
        parts = line.split()
        if len(parts) != 2:
            continue
        commit, parent = parts
        stat = git(repo, "show", "--numstat", "--format=", commit).splitlines()
        files, lines = [], 0
        for row in stat:
            added, deleted, path = row.split("\t", 2)
            if added == "-":
                files = []
                break
            lines += int(added) + int(deleted)
            files.append(path)
        tests = [f for f in files if is_test(f)]
        sources = [f for f in files if f.endswith(".py") and not is_test(f)]
        message = git(repo, "log", "-1", "--format=%B", commit).strip()
        # A revert's message names the commit it undoes, not the change: no task to give.
        if tests and sources and lines <= max_lines and not message.startswith("Revert"):
            yield commit, parent, message, sources, tests


def checkout(repo, commit, into):
    """A fresh repository at `commit` with its history only up to it (nothing after it to find)."""
    os.makedirs(into, exist_ok=True)
    git(into, "init", "-q", "-b", "main")
    git(into, "fetch", "-q", os.path.abspath(repo), commit)
    git(into, "checkout", "-q", "FETCH_HEAD")
    git(into, "checkout", "-q", "-B", "main")


def put_tests(repo, commit, tests, work):
    """Writes the test files as they are at `commit` into `work`."""
    for t in tests:
        path = os.path.join(work, t)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(git(repo, "show", f"{commit}:{t}"))


def run_tests(work, tests, timeout=300):
    modules = [t[:-3].replace("/", ".") for t in tests]
    try:
        p = subprocess.run([sys.executable, "-m", "unittest", *modules], cwd=work, capture_output=True, text=True,
                           timeout=timeout, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
        return p.returncode == 0, p.stdout + p.stderr
    except subprocess.TimeoutExpired:
        return False, f"the tests timed out after {timeout} s"


def verify(repo, task):
    """Whether the task's tests fail at its parent and pass at its commit."""
    with tempfile.TemporaryDirectory(prefix="repo-task-") as tmp:
        before = os.path.join(tmp, "before")
        checkout(repo, task["parent"], before)
        put_tests(repo, task["commit"], task["tests"], before)
        failed_before = not run_tests(before, task["tests"])[0]
        after = os.path.join(tmp, "after")
        checkout(repo, task["commit"], after)
        passed_after = run_tests(after, task["tests"])[0]
        shutil.rmtree(before, ignore_errors=True)
        return failed_before and passed_after


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["select", "check"])
    ap.add_argument("--git", required=True, help="a clone of the repository (any, bare or not)")
    ap.add_argument("--out", help="select: where the task list goes")
    ap.add_argument("--name", help="select: the public repository the tasks come from (its URL)")
    ap.add_argument("--tasks", help="check: the task list")
    ap.add_argument("--limit", type=int, default=12)
    ap.add_argument("--max-lines", type=int, default=160)
    ap.add_argument("--scan", type=int, default=400, help="select: how many of the newest commits to look at")
    args = ap.parse_args()
    if args.command == "check":
        tasks = json.load(open(args.tasks))["tasks"]
        bad = [t["id"] for t in tasks if not verify(args.git, t)]
        print(json.dumps({"tasks": len(tasks), "bad": bad}))
        sys.exit(1 if bad else 0)
    origin = args.name or git(args.git, "config", "--get", "remote.origin.url", check=False).strip()
    tasks = []
    for commit, parent, message, sources, tests in candidates(args.git, args.max_lines, args.scan):
        task = {"id": commit[:10], "commit": commit, "parent": parent, "message": message, "sources": sources,
                "tests": tests}
        ok = verify(args.git, task)
        print(json.dumps({"commit": commit[:10], "message": message.splitlines()[0], "usable": ok}), flush=True)
        if ok:
            tasks.append(task)
        if len(tasks) >= args.limit:
            break
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"repository": origin, "tasks": tasks}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
