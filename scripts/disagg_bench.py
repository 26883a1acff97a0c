#!/usr/bin/env python3
"""Prefill/decode disaggregation against unified serving, on one machine (scripts/disagg-bench.sh).

Four `cachet serve` processes on loopback, each with its own data directory (private Postgres)
and the KV disk tier on: a unified server (THREADS threads), a prefill server (PREFILL_THREADS)
and two decode servers that ask it (DECODE_THREADS each), one per `[disagg] reserve` policy:
`prefill_complete` ("disagg") and `early`. Each round, on each setup in turn (rotating which goes
first), with new tenants so that nothing is cached:

1. *A long prompt alone*: a chat completion of about PROMPT tokens (this repository's source
   text), greedy, streamed. Reported: the client's TTFT and the ledger's split (queue, the K/V
   moved from the prefill server: its computation and the transfer, then the decode server's own
   part: the last partial chunk and the first token), the bytes moved, and the share of the
   (decode) server's KV pool in use while the request runs, sampled every 0.25 s: mean and peak
   (`early` holds the prompt's slots throughout the remote prefill).
2. *Interference*: a running generation (short prompt, GEN tokens) is streaming when the long
   prompt of step 1 (another one, so not cached) arrives; reported: the running generation's
   inter-token latency before the arrival and while the long prompt is being prefilled (median and
   largest gap).

Checks: the long prompt's greedy output is the same text on every setup in every round. Writes
disagg.json and disagg.md under --out.
"""
import argparse
import http.client
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

OPERATOR = "disagg-bench-operator-token"


def call(port, token, method, path, body=None, raw=False):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"authorization": f"Bearer {token}", "content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=900) as r:
        data = r.read()
        return data.decode() if raw else json.loads(data)


def stream_chat(port, token, model, content, max_tokens, on_token=None):
    """One streamed chat completion: (send time, token arrival times, text, usage)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    sent = time.monotonic()
    conn.request("POST", "/v1/chat/completions", json.dumps(body),
                 {"authorization": f"Bearer {token}", "content-type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise SystemExit(f"chat: HTTP {resp.status}: {resp.read()[:400]!r}")
    times, text, usage = [], "", {}
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        event = json.loads(line[5:])
        for choice in event.get("choices", []):
            piece = choice.get("delta", {}).get("content") or ""
            if piece:
                times.append(time.monotonic())
                text += piece
                if on_token:
                    on_token(len(times))
        usage = event.get("usage") or usage
    return sent, times, text, usage


def metric(port, name):
    """The sum of a Prometheus series (all labels) on the server at `port`."""
    text = call(port, OPERATOR, "GET", "/metrics", raw=True)
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})? ([0-9.eE+-]+|NaN)$", line)
        if m and m.group(2) != "NaN":
            total += float(m.group(2))
    return total


def final_row(port, token, prompt_tokens):
    """The tenant's ledger row of the request with `prompt_tokens`, once it is final (the ledger
    writes in the background: the row opened at admission is replaced at the end)."""
    deadline = time.monotonic() + 30
    while True:
        rows = [x for x in call(port, token, "GET", "/v1/usage?limit=5")["data"]
                if x["prompt_tokens"] == prompt_tokens and x["status"] != "running" and x["ttft_ms"] is not None]
        if rows or time.monotonic() > deadline:
            if not rows:
                raise SystemExit("the request's ledger row was never final")
            return rows[0]
        time.sleep(0.2)


def wait_ready(port, proc, log):
    deadline = time.monotonic() + 900
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


def source_text(root, chars, skip):
    """`chars` characters of the repository's Rust source, starting `skip` characters in."""
    out = []
    for dirpath, _, files in sorted(os.walk(root)):
        if "/target" in dirpath or "/." in dirpath:
            continue
        for f in sorted(files):
            if f.endswith(".rs"):
                with open(os.path.join(dirpath, f), errors="replace") as fh:
                    out.append(fh.read())
        if sum(map(len, out)) > chars + skip:
            break
    return "".join(out)[skip:skip + chars]


def main():
    ap = argparse.ArgumentParser()
    for name in ("cachet", "model", "out", "source"):
        ap.add_argument(f"--{name}", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--port", type=int, default=18110)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prefill-threads", type=int, default=1)
    ap.add_argument("--decode-threads", type=int, default=1)
    ap.add_argument("--prompt-chars", type=int, default=14000)
    ap.add_argument("--gen", type=int, default=160)
    a = ap.parse_args()
    model_id = os.path.basename(a.model).removesuffix(".gguf")
    procs = {}

    def start(name, port, threads, extra):
        data = os.path.join(a.out, f"data-{name}")
        os.makedirs(data, exist_ok=True)
        env = dict(os.environ, CACHET_SERVER__BIND=f"127.0.0.1:{port}", CACHET_MODEL__PATH=a.model,
                   CACHET_MODEL__THREADS=str(threads), CACHET_ENGINE__KV_TIER_GIB="8",
                   CACHET_AUTH__OPERATOR_TOKEN=OPERATOR, RUST_LOG=os.environ.get("CACHET_RUST_LOG", "warn"),
                   **extra)
        env.pop("DATABASE_URL", None)
        log = os.path.join(a.out, f"{name}.log")
        proc = subprocess.Popen([a.cachet, "serve", "--data-dir", data], env=env,
                                stdout=open(log, "a"), stderr=subprocess.STDOUT)
        procs[name] = (proc, port, data, env)
        return proc, log

    up, pp, dp, ep = a.port, a.port + 1, a.port + 2, a.port + 3
    decode_env = {"CACHET_DISAGG__ROLE": "decode", "CACHET_DISAGG__PREFILL_URLS": f'["http://127.0.0.1:{pp}"]'}
    started = [start("unified", up, a.threads, {}),
               start("prefill", pp, a.prefill_threads, {"CACHET_DISAGG__ROLE": "prefill"}),
               start("decode", dp, a.decode_threads, dict(decode_env, CACHET_DISAGG__RESERVE="prefill_complete")),
               start("early", ep, a.decode_threads, dict(decode_env, CACHET_DISAGG__RESERVE="early"))]
    setups = ["unified", "disagg", "early"]
    ports = {"unified": up, "disagg": dp, "early": ep}
    servers = {"unified": "unified", "disagg": "decode", "early": "early"}
    try:
        for (proc, log), port in zip(started, (up, pp, dp, ep)):
            wait_ready(port, proc, log)

        def tenant(name):
            _, port, data, env = procs[name]
            run = lambda *args: subprocess.run([a.cachet, *args, "--data-dir", data], env=env, check=True,
                                               capture_output=True, text=True).stdout.strip().splitlines()[-1]
            t = run("tenants", "create", f"bench-{name}-{time.time_ns()}")
            return run("token", "issue", "--tenant", t, "--ttl", "2h")

        rows = []
        for r in range(a.rounds):
            order = setups[r % 3:] + setups[:r % 3]
            long_a = f"Round {r}. Summarise this code:\n" + source_text(a.source, a.prompt_chars, 997 * r)
            long_b = f"Round {r}, again. Summarise this code:\n" + source_text(a.source, a.prompt_chars, 997 * r + 50000)
            for setup in order:
                port = ports[setup]
                token = tenant(servers[setup])
                before = {k: metric(port, k) for k in ("cachet:disagg_transfer_bytes_total",
                                                      "cachet:disagg_remote_prefill_seconds_sum",
                                                      "cachet:disagg_transfer_seconds_sum")}
                held, sampling = [], [True]
                def sample():
                    while sampling[0]:
                        held.append(metric(port, "cachet:kv_cache_usage_ratio"))
                        time.sleep(0.25)
                sampler = threading.Thread(target=sample)
                sampler.start()
                sent, times, text, usage = stream_chat(port, token, model_id, long_a, 16)
                sampling[0] = False
                sampler.join()
                ledger = final_row(port, token, usage["prompt_tokens"])
                after = {k: metric(port, k) for k in before}
                moved = ledger.get("kv_transfer_ms") or 0.0
                remote = 1e3 * (after["cachet:disagg_remote_prefill_seconds_sum"]
                                - before["cachet:disagg_remote_prefill_seconds_sum"])
                transfer = 1e3 * (after["cachet:disagg_transfer_seconds_sum"]
                                  - before["cachet:disagg_transfer_seconds_sum"])
                nbytes = after["cachet:disagg_transfer_bytes_total"] - before["cachet:disagg_transfer_bytes_total"]
                row = {"round": r, "setup": setup, "prompt_tokens": usage["prompt_tokens"],
                       "cached": (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
                       "ttft_ms": 1e3 * (times[0] - sent), "queue_ms": ledger["queue_ms"],
                       "remote_prefill_ms": remote, "transfer_ms": transfer,
                       "local_ms": ledger["ttft_ms"] - moved - ledger["queue_ms"],
                       "bytes": nbytes, "kv_held": max(held), "kv_held_mean": statistics.mean(held),
                       "text": text}

                # Interference: a running generation when another long prompt arrives.
                token2 = tenant(servers[setup])
                arrival = {}
                def send_long(n):
                    if n == 40 and "t" not in arrival:
                        arrival["t"] = time.monotonic()
                        def go():
                            s, t, _, _ = stream_chat(port, token2, model_id, long_b, 4)
                            arrival["first"] = t[0]
                        arrival["thread"] = threading.Thread(target=go)
                        arrival["thread"].start()
                _, run_times, _, _ = stream_chat(port, token, model_id, "Count from 1 to 400, one number per line.",
                                                 a.gen, on_token=send_long)
                arrival["thread"].join()
                gaps = [1e3 * (b - x) for x, b in zip(run_times, run_times[1:])]
                before_gaps = [g for x, g in zip(run_times[1:], gaps) if x < arrival["t"]][5:]
                during = [g for x, g in zip(run_times[1:], gaps) if arrival["t"] <= x <= arrival["first"]]
                row.update({"itl_before_ms": statistics.median(before_gaps) if before_gaps else None,
                            "itl_during_ms": statistics.median(during) if during else None,
                            "itl_during_max_ms": max(during) if during else None,
                            "tokens_during": len(during),
                            "long_ttft_during_ms": 1e3 * (arrival["first"] - arrival["t"])})
                print(json.dumps({k: v for k, v in row.items() if k != "text"}), file=sys.stderr)
                rows.append(row)
    finally:
        for proc, *_ in procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc, *_ in procs.values():
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()

    with open(os.path.join(a.out, "disagg.json"), "w") as f:
        json.dump(rows, f, indent=1)
    same = all(len({x["text"] for x in rows if x["round"] == r}) == 1 for r in range(a.rounds))

    def med(setup, k):
        v = [x[k] for x in rows if x["setup"] == setup and x[k] is not None]
        return statistics.median(v) if v else float("nan")

    lines = [
        f"disaggregation on one machine: {model_id}; unified {a.threads} threads, prefill {a.prefill_threads} + "
        f"decode {a.decode_threads} (disagg: reserve = prefill_complete, early: reserve = early); {a.rounds} "
        "rotating rounds, medians",
        "",
        "| setup | prompt tokens | TTFT | queue | prefill (remote) | KV transfer not overlapped "
        "| local prefill + first token | MB moved | KV pool in use meanwhile (mean / peak) | ITL before "
        "| ITL while a long prompt prefills (median / max) | its TTFT |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for setup in setups:
        lines.append(
            f"| {setup} | {med(setup, 'prompt_tokens'):.0f} | {med(setup, 'ttft_ms'):.0f} ms "
            f"| {med(setup, 'queue_ms'):.0f} ms | {med(setup, 'remote_prefill_ms'):.0f} ms "
            f"| {med(setup, 'transfer_ms'):.0f} ms | {med(setup, 'local_ms'):.0f} ms "
            f"| {med(setup, 'bytes') / 1e6:.1f} | {100 * med(setup, 'kv_held_mean'):.2f}% / "
            f"{100 * med(setup, 'kv_held'):.2f}% "
            f"| {med(setup, 'itl_before_ms'):.1f} ms | {med(setup, 'itl_during_ms'):.1f} / "
            f"{med(setup, 'itl_during_max_ms'):.0f} ms | {med(setup, 'long_ttft_during_ms'):.0f} ms |")
    lines += ["", f"Greedy outputs of the long prompt equal on every setup in every round: {same}"]
    with open(os.path.join(a.out, "disagg.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    if not same:
        for r in range(a.rounds):
            for x in rows:
                if x["round"] == r:
                    print(f"round {r} {x['setup']}: {x['text']!r}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
