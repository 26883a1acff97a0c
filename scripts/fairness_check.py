"""While one tenant attacks, how long another tenant's short request takes (issue "Hardening,
second round": items 2, 3 and 5).

Usage: fairness_check.py BASE ATTACKER_TOKEN VICTIM_TOKEN MODEL [ROUNDS]

For each attack, ROUNDS times (default 7), alternating: the victim's short request alone, while
the attacker sends the attack's benign twin in a loop (the same request without what makes it
an attack: any request that decodes beside the victim's shares its steps), and while the
attacker sends the attack in a loop. Prints the medians and the ratios (the bar: at most 2x).
"""
import json
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request

BASE, ATTACKER, VICTIM, MODEL = sys.argv[1:5]
ROUNDS = int(sys.argv[5]) if len(sys.argv) > 5 else 7


def post(token, body, timeout=600):
    req = urllib.request.Request(
        f"{BASE}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    start = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status = r.status
            r.read()
    except urllib.error.HTTPError as e:
        status = e.code
        e.read()
    return status, time.monotonic() - start


def chat(content, max_tokens, **extra):
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0, **extra}


SHORT = chat("Name a prime number.", 8)
counter = iter(range(10**9))


def failing_grammar(hostile=True):
    i = next(counter)
    extra = {"grammar": {"regex": f"(a{{1000}}){{1000}}z{i}"}} if hostile else {}
    return post(ATTACKER, chat("hi", 4, **extra))


def long_stops(hostile=True):
    extra = {"stop": [" " * 250 + str(i) for i in range(32)]} if hostile else {}
    return post(ATTACKER, chat("hi", 64, grammar={"regex": " {1,200}"}, **extra))


def repeated_calls(hostile=True):
    tools = [{"type": "function", "function": {"name": "ping", "parameters": {
        "type": "object", "properties": {"host": {"enum": ["a"]}}, "required": ["host"]}}}]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "ping host a"}], "tools": tools,
            "tool_choice": "required", "parallel_tool_calls": hostile, "temperature": 0.7}
    return post(ATTACKER, body)


def under(attack):
    stop = threading.Event()
    statuses = []

    def loop():
        while not stop.is_set():
            statuses.append(attack()[0])

    t = threading.Thread(target=loop)
    t.start()
    time.sleep(1.0)
    status, took = post(VICTIM, SHORT)
    stop.set()
    t.join()
    assert status == 200, status
    return took, statuses


post(VICTIM, SHORT)  # warm up
print("| attack | victim alone | beside the benign twin | during the attack | attack / alone | attack / twin | attack answers |")
print("|---|---:|---:|---:|---:|---:|---|")
for name, attack in [("failing grammars (item 2)", failing_grammar), ("32 stops of 250 bytes (item 3)", long_stops),
                     ("required parallel calls of one call (item 5)", repeated_calls)]:
    alone, twin, attacked, seen = [], [], [], []
    for _ in range(ROUNDS):
        status, took = post(VICTIM, SHORT)
        assert status == 200, status
        alone.append(took)
        twin.append(under(lambda: attack(False))[0])
        took, statuses = under(attack)
        attacked.append(took)
        seen.extend(statuses)
    a, t, b = statistics.median(alone), statistics.median(twin), statistics.median(attacked)
    counts = ", ".join(f"{s}: {seen.count(s)}" for s in sorted(set(seen)))
    print(f"| {name} | {a * 1e3:.0f} ms | {t * 1e3:.0f} ms | {b * 1e3:.0f} ms | {b / a:.2f} | {b / t:.2f} | {counts} |")
