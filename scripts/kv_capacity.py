"""How many tenants' repository contexts one KV pool keeps warm (issue 54's capacity run).

Usage: kv_capacity.py BASE MODEL CONTEXT_TOKENS TEXT_FILE TOKEN...

One tenant per TOKEN, each with its own repository context (a different stretch of TEXT_FILE, about
CONTEXT_TOKENS tokens, in the system message, as the repeated-context scenario sends it). First
every tenant asks a question, one after another (each context computed and left in the cache);
then each asks a second question about its context, most recent tenant first, and the answer's
`usage.prompt_tokens_details.cached_tokens` says whether its context was still in the cache
(warm: at least 90% of the context's tokens read from it). Probing the most recent first means a
probe never evicts a context that has not been probed yet but is still held: the cache gives up
its least recently used blocks, and those belong to the tenants probed last, or to none.

Prints one JSON object: tenants, contexts held warm, time to the answer of warm and of cold probes
(medians), and every probe.
"""
import json
import statistics
import sys
import time
import urllib.request

BASE, MODEL, CONTEXT_TOKENS, TEXT_FILE = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
TOKENS = sys.argv[5:]
CHARS_PER_TOKEN = 3.5
SYSTEM = ("You are a senior software engineer. Answer questions about the repository whose files follow. "
          "Be concise and refer to files by path.\n\n")


def ask(token, context, question):
    body = {"model": MODEL, "max_tokens": 1, "temperature": 0,
            "messages": [{"role": "system", "content": SYSTEM + context}, {"role": "user", "content": question}]}
    req = urllib.request.Request(f"{BASE}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    start = time.monotonic()
    with urllib.request.urlopen(req, timeout=900) as r:
        usage = json.load(r)["usage"]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return usage["prompt_tokens"], cached, time.monotonic() - start


def main():
    text = open(TEXT_FILE, encoding="utf-8", errors="replace").read()
    size = int(CONTEXT_TOKENS * CHARS_PER_TOKEN)
    if len(text) < size * len(TOKENS):
        sys.exit(f"{TEXT_FILE}: {len(text)} characters, {size * len(TOKENS)} needed for {len(TOKENS)} contexts")
    contexts = [text[i * size:(i + 1) * size] for i in range(len(TOKENS))]
    fill = []
    for i, (token, context) in enumerate(zip(TOKENS, contexts)):
        prompt, cached, secs = ask(token, context, "Which file above is the longest? Answer with its path.")
        fill.append({"tenant": i, "prompt_tokens": prompt, "cached_tokens": cached, "seconds": round(secs, 3)})
    probes = []
    for i in reversed(range(len(TOKENS))):
        prompt, cached, secs = ask(TOKENS[i], contexts[i], "Which file above is the shortest? Answer with its path.")
        warm = cached >= 0.9 * fill[i]["prompt_tokens"]
        probes.append({"tenant": i, "prompt_tokens": prompt, "cached_tokens": cached, "seconds": round(secs, 3),
                       "warm": warm})
    warm = [p["seconds"] for p in probes if p["warm"]]
    cold = [p["seconds"] for p in probes if not p["warm"]]
    print(json.dumps({
        "tenants": len(TOKENS),
        "context_tokens": statistics.median(f["prompt_tokens"] for f in fill),
        "held_warm": len(warm),
        "warm_probe_s": statistics.median(warm) if warm else None,
        "cold_probe_s": statistics.median(cold) if cold else None,
        "fill": fill,
        "probes": probes,
    }))


if __name__ == "__main__":
    main()
