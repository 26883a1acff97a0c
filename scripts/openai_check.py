"""The official `openai` Python package against a running `cachet serve`
with the real default model: chat (streaming and not), text completions,
usage with cached tokens, model listing, and a typed error.

    python scripts/openai_check.py BASE_URL TOKEN MODEL
"""
import sys

import openai
from openai import OpenAI

base, token, model = sys.argv[1:4]
client = OpenAI(base_url=base + "/v1", api_key=token, max_retries=0)

question = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
r = client.chat.completions.create(model=model, messages=question, max_tokens=16, temperature=0)
text = r.choices[0].message.content
assert "Paris" in text, text
u = r.usage
assert u.prompt_tokens > 0 and u.completion_tokens > 0, u
assert u.total_tokens == u.prompt_tokens + u.completion_tokens, u
assert r.choices[0].finish_reason == "stop", r.choices[0].finish_reason

# The same conversation again: its prompt comes from the prefix cache.
again = client.chat.completions.create(model=model, messages=question, max_tokens=16, temperature=0)
assert again.choices[0].message.content == text
assert again.usage.prompt_tokens_details.cached_tokens == u.prompt_tokens - 1, again.usage

# Streaming, with usage in the last chunk.
stream = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "Write a Python function that returns the sum of a list."}],
    max_tokens=80,
    temperature=0,
    stream=True,
    stream_options={"include_usage": True},
)
streamed, usage, finish = "", None, None
for chunk in stream:
    if chunk.choices:
        streamed += chunk.choices[0].delta.content or ""
        finish = chunk.choices[0].finish_reason or finish
    if chunk.usage:
        usage = chunk.usage
assert "def " in streamed, streamed
assert usage is not None and usage.completion_tokens > 0, usage
assert finish in ("stop", "length"), finish

# Text completion.
c = client.completions.create(model=model, prompt="def fibonacci(n):", max_tokens=24, temperature=0)
assert c.choices[0].text.strip(), c
assert c.usage.completion_tokens > 0

assert [m.id for m in client.models.list()] == [model]

try:
    client.chat.completions.create(model="no-such-model", messages=question)
    raise AssertionError("an unknown model must fail")
except openai.NotFoundError:
    pass

print(f"openai {openai.__version__} checks passed against {base} ({model}): {text!r}")
