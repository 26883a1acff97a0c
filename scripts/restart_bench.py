#!/usr/bin/env python3
"""A restart with the KV disk tier, on cachet with the default model (scripts/restart-bench.sh).

Each round, on one data directory (its private Postgres and its disk tier kept across restarts):
start `cachet serve` with the disk tier on; a new tenant registers a copy of a git repository and
opens a session whose first turn carries the repository context (cold: nothing of it is cached);
stop the server (SIGTERM: the tier is flushed); start it again; the same tenant opens a new session
on the same commit and sends the same turn. Reported per round: both TTFTs, the prompt and cached
tokens, whether the outputs are equal (greedy). Exits non-zero when an output differs or the
restarted turn was not served from the tier (less than 90% of its prompt cached): the check
scripts/test.sh runs with ROUNDS=1.
"""
import argparse
import http.client
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.request

QUESTION = "Which function in this repository would you change first to add a --verbose flag, and why?"


def call(port, token, method, path, body=None):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"authorization": f"Bearer {token}", "content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def turn(port, token, session, max_tokens):
    """One streamed turn: (ttft seconds, text, prompt tokens, cached tokens)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = {"content": QUESTION, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    start = time.monotonic()
    conn.request("POST", f"/v1/sessions/{session}/messages", json.dumps(body),
                 {"authorization": f"Bearer {token}", "content-type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise SystemExit(f"turn: HTTP {resp.status}: {resp.read()[:400]!r}")
    ttft, text, usage = None, "", {}
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        event = json.loads(line[5:])
        for choice in event.get("choices", []):
            piece = choice.get("delta", {}).get("content") or ""
            if piece and ttft is None:
                ttft = time.monotonic() - start
            text += piece
        usage = event.get("usage") or usage
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return ttft, text, usage.get("prompt_tokens", 0), cached


def wait_ready(port, proc, log):
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"cachet exited ({proc.returncode}); see {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit("cachet never became ready")


def main():
    ap = argparse.ArgumentParser()
    for name in ("cachet", "model", "data", "work", "source", "out"):
        ap.add_argument(f"--{name}", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--port", type=int, default=18095)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=32)
    a = ap.parse_args()
    env = dict(os.environ, CACHET_SERVER__BIND=f"127.0.0.1:{a.port}", CACHET_MODEL__PATH=a.model,
               CACHET_MODEL__THREADS=str(a.threads), CACHET_ENGINE__KV_TIER_GIB="8",
               CACHET_CONTEXT__ALLOWED_ROOT=a.work, RUST_LOG=os.environ.get("CACHET_RUST_LOG", "warn"))
    model_id = os.path.basename(a.model).removesuffix(".gguf")
    log = os.path.join(a.out, "cachet.log")

    def start():
        proc = subprocess.Popen([a.cachet, "serve", "--data-dir", a.data], env=env,
                                stdout=open(log, "a"), stderr=subprocess.STDOUT)
        wait_ready(a.port, proc, log)
        return proc

    def stop(proc):
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)

    def cli(*args):
        out = subprocess.run([a.cachet, *args, "--data-dir", a.data], env=env, check=True,
                             capture_output=True, text=True).stdout
        return out.strip().splitlines()[-1]

    rows = []
    for r in range(a.rounds):
        proc = start()
        try:
            tenant = cli("tenants", "create", f"restart-{r}-{int(time.time())}")
            token = cli("token", "issue", "--tenant", tenant, "--ttl", "2h")
            copy = os.path.join(a.work, f"restart-{r}")
            shutil.rmtree(copy, ignore_errors=True)
            subprocess.run(["git", "clone", "-q", a.source, copy], check=True)
            reg = call(a.port, token, "POST", "/v1/repos", {"url": copy, "name": f"restart-{r}"})
            while call(a.port, token, "GET", f"/v1/repos/{reg['id']}")["status"] != "ready":
                time.sleep(0.5)
            session = call(a.port, token, "POST", "/v1/sessions", {"repo": reg["id"]})["id"]
            cold = turn(a.port, token, session, a.max_tokens)
        finally:
            stop(proc)
        proc = start()
        try:
            session = call(a.port, token, "POST", "/v1/sessions", {"repo": reg["id"]})["id"]
            restored = turn(a.port, token, session, a.max_tokens)
        finally:
            stop(proc)
        row = {"round": r, "cold_ttft_ms": 1e3 * cold[0], "restored_ttft_ms": 1e3 * restored[0],
               "prompt_tokens": cold[2], "cold_cached": cold[3], "restored_cached": restored[3],
               "same_output": cold[1] == restored[1], "cold_text": cold[1], "restored_text": restored[1]}
        print(json.dumps({k: v for k, v in row.items() if not k.endswith("_text")}), file=sys.stderr)
        rows.append(row)

    with open(os.path.join(a.out, "restart.json"), "w") as f:
        json.dump(rows, f, indent=1)
    med = lambda k: statistics.median(r[k] for r in rows)
    lines = [
        f"restart with the KV disk tier: {model_id}, {a.threads} threads, {len(rows)} rounds (medians)",
        "",
        "| prompt tokens | cold turn TTFT | cached | after a restart TTFT | cached | ratio | same output |",
        "|---:|---:|---:|---:|---:|---:|---|",
        f"| {med('prompt_tokens'):.0f} | {med('cold_ttft_ms'):.0f} ms | {med('cold_cached'):.0f} "
        f"| {med('restored_ttft_ms'):.0f} ms | {med('restored_cached'):.0f} "
        f"| {med('restored_ttft_ms') / med('cold_ttft_ms'):.2f} "
        f"| {sum(r['same_output'] for r in rows)} of {len(rows)} |",
    ]
    with open(os.path.join(a.out, "restart.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    bad = [r for r in rows if not r["same_output"] or r["restored_cached"] < 0.9 * r["prompt_tokens"]]
    if bad:
        for r in bad:
            print(f"round {r['round']}: same output {r['same_output']}, {r['restored_cached']} of "
                  f"{r['prompt_tokens']} prompt tokens cached after the restart\n  cold:     {r['cold_text']!r}\n"
                  f"  restored: {r['restored_text']!r}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
