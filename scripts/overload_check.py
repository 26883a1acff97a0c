"""Forty requests at once beyond capacity: how long the refused ones wait for their 429.

Usage: overload_check.py BASE TOKEN MODEL [N] [WORDS]

A long request first keeps the engine busy (its prefill runs in passes of seconds on a small
CPU); then N requests of WORDS words (default 60, about 200 tokens: short enough that each
could make the 3 s target alone, so refusing them is what waiting would fix) from the same
tenant arrive together. Prints, for the
refused ones (429 with Retry-After), the time from sending to the status line (p50 / p99 / max),
and how many were admitted.
"""
import json
import sys
import threading
import time
import urllib.error
import urllib.request

BASE, TOKEN, MODEL = sys.argv[1], sys.argv[2], sys.argv[3]
N = int(sys.argv[4]) if len(sys.argv) > 4 else 40
SIZE = int(sys.argv[5]) if len(sys.argv) > 5 else 60
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def prompt(seed, words):
    return " ".join(WORDS[(seed * 7 + i * 13) % len(WORDS)] + str((seed * 31 + i) % 97) for i in range(words))


def post(body, timeout=600):
    req = urllib.request.Request(
        f"{BASE}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    start = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, retry = r.status, None
            r.read()
    except urllib.error.HTTPError as e:
        status, retry = e.code, e.headers.get("Retry-After")
        e.read()
    return status, retry, time.monotonic() - start


def chat(seed, words, max_tokens):
    return {"model": MODEL, "messages": [{"role": "user", "content": prompt(seed, words)}], "max_tokens": max_tokens}


# Warm up, then keep the engine busy with a long prompt.
post(chat(0, 50, 2))
busy = threading.Thread(target=post, args=(chat(1, 1500, 64),))
busy.start()
time.sleep(1.0)
results = [None] * N
threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, post(chat(100 + i, SIZE, 8)))) for i in range(N)]
for t in threads:
    t.start()
for t in threads:
    t.join()
busy.join()
refused = sorted(r[2] for r in results if r[0] == 429)
with_retry = sum(1 for r in results if r[0] == 429 and r[1])
admitted = sum(1 for r in results if r[0] == 200)
other = [r[0] for r in results if r[0] not in (200, 429)]


def pct(xs, q):
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


print(f"{N} requests: {admitted} admitted, {len(refused)} refused ({with_retry} with Retry-After), other: {other}")
print(
    "429 latency ms: p50 %.0f, p90 %.0f, p99 %.0f, max %.0f; over 200 ms: %d"
    % (
        pct(refused, 0.5) * 1e3,
        pct(refused, 0.9) * 1e3,
        pct(refused, 0.99) * 1e3,
        (refused[-1] if refused else float("nan")) * 1e3,
        sum(1 for r in refused if r > 0.2),
    )
)
