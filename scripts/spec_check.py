"""Speculative decoding side by side (issue "Speculative decoding for agent outputs"): the code edit of
`cachet bench --spec` (scripts/fairness_check.py asked back with `post` renamed, greedy) through
cachet with and without drafting, and through llama.cpp's llama-server without speculation and with
each of its draftless (n-gram) modes, in alternating rounds; decode tokens/s as each reports it
(cachet: its engine loop, tokens after the first over the time to the last; llama-server: the
`timings.predicted_per_second` of its answer), medians.

Usage: spec_check.py CACHET_BIN LLAMA_SERVER MODEL.gguf [ROUNDS] [GEN] [THREADS]
"""
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

CACHET, SERVER, MODEL = sys.argv[1:4]
ROUNDS = int(sys.argv[4]) if len(sys.argv) > 4 else 3
GEN = int(sys.argv[5]) if len(sys.argv) > 5 else 256
THREADS = sys.argv[6] if len(sys.argv) > 6 else "2"
FILE = open(os.path.join(os.path.dirname(__file__), "fairness_check.py")).read()
MESSAGE = (f"Here is scripts/fairness_check.py:\n\n```python\n{FILE}```\n\nRename the function `post` to "
           "`send_request` everywhere in it. Answer with the whole new file in one ```python block and nothing else.")
# llama-server's draftless modes (its defaults for each), and none.
MODES = {"none": [], "ngram-simple": ["--spec-type", "ngram-simple"], "ngram-map-k": ["--spec-type", "ngram-map-k"],
         "ngram-mod": ["--spec-type", "ngram-mod"], "ngram-cache": ["--spec-type", "ngram-cache"]}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def llama(mode):
    port = free_port()
    args = [SERVER, "-m", MODEL, "-t", THREADS, "-tb", THREADS, "--port", str(port), "-c", "8192", "-np", "1",
            "--no-webui"] + MODES[mode]
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
                break
            except Exception:
                time.sleep(0.2)
        body = {"messages": [{"role": "user", "content": MESSAGE}], "max_tokens": GEN, "temperature": 0,
                "cache_prompt": True}
        req = lambda: urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                             data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req(), timeout=900).read()  # the prompt cached, as cachet's is
        out = json.loads(urllib.request.urlopen(req(), timeout=900).read())
        t = out.get("timings", {})
        return t.get("predicted_per_second", float("nan")), t.get("draft_n", 0), t.get("draft_n_accepted", 0)
    finally:
        p.terminate()
        p.wait()


def cachet():
    out = subprocess.run([CACHET, "bench", "--spec", "--model", MODEL, "--threads", THREADS, "--gen", str(GEN),
                          "--reps", "1", "--json"], capture_output=True, text=True, check=True).stdout
    row = json.loads(out.strip().splitlines()[-1])["rows"][0]
    assert row["same_tokens"], "drafting changed cachet's tokens"
    return row


seen = {k: [] for k in ["cachet plain", "cachet drafting"] + [f"llama-server {m}" for m in MODES]}
drafts = {k: [0, 0] for k in seen}
for r in range(ROUNDS):
    order = list(MODES) if r % 2 == 0 else list(reversed(MODES))
    if r % 2 == 0:
        order = ["cachet"] + order
    else:
        order = order + ["cachet"]
    for what in order:
        if what == "cachet":
            row = cachet()
            seen["cachet plain"].append(row["plain_tps"])
            seen["cachet drafting"].append(row["drafting_tps"])
            drafts["cachet drafting"][0] += row["drafted"]
            drafts["cachet drafting"][1] += row["accepted"]
        else:
            tps, n, a = llama(what)
            seen[f"llama-server {what}"].append(tps)
            drafts[f"llama-server {what}"][0] += n
            drafts[f"llama-server {what}"][1] += a
        print(f"round {r + 1}: {what} done", file=sys.stderr, flush=True)

base = statistics.median(seen["cachet plain"])
print(f"| engine, mode | decode tok/s (median of {ROUNDS}) | × cachet plain | drafted | confirmed |")
print("|---|---:|---:|---:|---:|")
for k, v in seen.items():
    m = statistics.median(v)
    d, a = drafts[k]
    print(f"| {k} | {m:.1f} | {m / base:.2f} | {d} | {a} |")
