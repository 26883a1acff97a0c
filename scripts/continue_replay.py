"""Replays the autocomplete requests Continue sends for a Qwen coder model
(its fill-in-the-middle template, its stop list with the language's, streamed
like the extension reads them) against a running `cachet serve`: once as a
raw FIM prompt, once with OpenAI's `suffix` field.

    python scripts/continue_replay.py BASE_URL TOKEN MODEL
"""
import sys

from openai import OpenAI

base, token, model = sys.argv[1:4]
client = OpenAI(base_url=base + "/v1", api_key=token, max_retries=0)

# Continue's stops for Qwen coder FIM (its template's special tokens), then those
# it adds for every completion and for Python.
STOPS = [
    "<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<|im_start|>", "<|im_end|>",
    "/src/", "#- coding: utf-8", "```", "\ndef", "\nclass", '\n"""#', "\n\n\n",
]
assert len(STOPS) == 16
prefix = "def mean(values):\n    \"\"\"The arithmetic mean of a non-empty list.\"\"\"\n    "
suffix = "\n\n\nprint(mean([1, 2, 3]))\n"
shapes = [
    {"prompt": f"<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>"},
    {"prompt": prefix, "suffix": suffix},
]
for shape in shapes:
    text, finish = "", None
    stream = client.completions.create(model=model, max_tokens=64, temperature=0.01, stop=STOPS, stream=True, **shape)
    for chunk in stream:
        text += chunk.choices[0].text
        finish = chunk.choices[0].finish_reason or finish
    assert text.strip(), f"empty completion for {shape}"
    assert not any(s in text for s in STOPS), f"a stop string leaked into {text!r}"
    assert finish in ("stop", "length"), finish
    print(f"{'suffix field' if 'suffix' in shape else 'raw FIM prompt'}: {text!r} ({finish})")
print("continue replay passed: 2 autocomplete requests with 16 stop strings each")
