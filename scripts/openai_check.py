"""The official `openai` Python package against a running `cachet serve`
with the real default model: chat (streaming and not), text completions,
usage with cached tokens, log-probabilities, the Responses API (a function
tool, streaming and not, and a `function_call_output` follow-up), model
listing, and a typed error.

    python scripts/openai_check.py BASE_URL TOKEN MODEL
"""
import json
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

# Log-probabilities: greedy, so each token is its step's most likely.
r = client.chat.completions.create(
    model=model, messages=question, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3
)
content = r.choices[0].logprobs.content
assert "".join(t.token for t in content) == r.choices[0].message.content, content
assert all(t.top_logprobs[0].token == t.token and len(t.top_logprobs) == 3 for t in content), content
c = client.completions.create(model=model, prompt="def add(a, b):", max_tokens=6, temperature=0, logprobs=2)
assert len(c.choices[0].logprobs.tokens) == c.usage.completion_tokens, c.choices[0].logprobs

# The Responses API: a function tool, its call, and the call's output sent back.
tools = [{
    "type": "function", "name": "read_file", "description": "Read a file of the repository.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"],
                   "additionalProperties": False},
}]
ask = [{"role": "user", "content": "Read notes.txt and tell me the secret number."}]
r = client.responses.create(model=model, input=ask, tools=tools, tool_choice="required", temperature=0,
                            parallel_tool_calls=False,
                            max_output_tokens=64, store=False)
calls = [o for o in r.output if o.type == "function_call"]
assert r.status == "completed" and calls and calls[0].name == "read_file", r.output
path = json.loads(calls[0].arguments)["path"]
assert "notes" in path, path
follow = ask + [calls[0].model_dump(exclude_none=True),
                {"type": "function_call_output", "call_id": calls[0].call_id, "output": "The secret number is 4217."}]
answer, kinds = None, []
with client.responses.stream(model=model, input=follow, tools=tools, temperature=0, parallel_tool_calls=False,
                             max_output_tokens=48) as stream:
    for event in stream:
        kinds.append(event.type)
    answer = stream.get_final_response()
assert kinds[0] == "response.created" and kinds[-1] == "response.completed", kinds
assert "response.output_item.done" in kinds, kinds
assert answer.output and answer.status == "completed", answer
# The call and its output went into the prompt (whether the 0.5B model then quotes the number is reported).
assert answer.usage.input_tokens > r.usage.input_tokens + 8, (r.usage, answer.usage)
assert answer.usage.input_tokens_details.cached_tokens > 0, answer.usage
try:
    client.responses.create(model=model, input="hi", previous_response_id="resp_x")
    raise AssertionError("previous_response_id must be refused (cachet keeps no responses)")
except openai.BadRequestError as e:
    assert e.param == "previous_response_id", (e.param, e)
solved = "4217" in answer.output_text
print(f"responses: read_file({path!r}) then {answer.output_text.strip()[:80]!r} (number quoted: {solved})")

assert [m.id for m in client.models.list()] == [model]

try:
    client.chat.completions.create(model="no-such-model", messages=question)
    raise AssertionError("an unknown model must fail")
except openai.NotFoundError:
    pass

print(f"openai {openai.__version__} checks passed against {base} ({model}): {text!r}")
