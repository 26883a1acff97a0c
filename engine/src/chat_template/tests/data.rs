//! Expected renderings produced by transformers 5.24 (`apply_chat_template(..., tokenize=False)`
//! and its Jinja2 environment), pasted verbatim.

/// Qwen2.5's chat template, as stored in the GGUF's `tokenizer.chat_template`.
pub(super) const QWEN25_TEMPLATE: &str = r##"{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"##;

/// transformers' `apply_chat_template(..., tokenize=False)` for the case below.
pub(super) const QWEN25_TOOLS_MESSAGES: &str = r##"[{"role": "user", "content": "Weather in Paris?"}]"##;

pub(super) const QWEN25_TOOLS_EXPECTED: &str = r##"<|im_start|>system
You are Qwen, created by Alibaba Cloud. You are a helpful assistant.

# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{"type": "function", "function": {"name": "get_weather", "description": "Météo actuelle — 天气", "parameters": {"type": "object", "properties": {"location": {"type": "string", "description": "City, e.g. \"Paris\""}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["location"]}}}
{"type": "function", "function": {"name": "search_code", "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "max_results": {"type": "integer", "default": 10}, "threshold": {"type": "number", "default": 0.5}}, "required": []}}}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
<|im_start|>user
Weather in Paris?<|im_end|>
<|im_start|>assistant
"##;

/// transformers' `apply_chat_template(..., tokenize=False)` for the case below.
pub(super) const QWEN25_TOOL_CALLS_MESSAGES: &str = r##"[{"role": "user", "content": "Weather in Zürich?"}, {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"location": "Zürich", "unit": "celsius", "days": 3, "ratio": 1.0, "flags": [true, false, null], "nested": {"z": 1, "a": "x\ny\t\"q\""}}}}, {"name": "search_code", "arguments": {"query": "fn main", "threshold": 2.5e-05}}]}, {"role": "tool", "content": "{\"temp\": 21}", "tool_call_id": "c1"}, {"role": "tool", "content": "no results", "tool_call_id": "c2"}, {"role": "assistant", "content": "It is 21°C."}]"##;

pub(super) const QWEN25_TOOL_CALLS_EXPECTED: &str = r##"<|im_start|>system
You are Qwen, created by Alibaba Cloud. You are a helpful assistant.

# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{"type": "function", "function": {"name": "get_weather", "description": "Météo actuelle — 天气", "parameters": {"type": "object", "properties": {"location": {"type": "string", "description": "City, e.g. \"Paris\""}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["location"]}}}
{"type": "function", "function": {"name": "search_code", "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "max_results": {"type": "integer", "default": 10}, "threshold": {"type": "number", "default": 0.5}}, "required": []}}}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
<|im_start|>user
Weather in Zürich?<|im_end|>
<|im_start|>assistant
<tool_call>
{"name": "get_weather", "arguments": {"location": "Zürich", "unit": "celsius", "days": 3, "ratio": 1.0, "flags": [true, false, null], "nested": {"z": 1, "a": "x\ny\t\"q\""}}}
</tool_call>
<tool_call>
{"name": "search_code", "arguments": {"query": "fn main", "threshold": 2.5e-05}}
</tool_call><|im_end|>
<|im_start|>user
<tool_response>
{"temp": 21}
</tool_response>
<tool_response>
no results
</tool_response><|im_end|>
<|im_start|>assistant
It is 21°C.<|im_end|>
"##;

pub(super) const QWEN25_TOOLS_JSON: &str = r##"[{"type": "function", "function": {"name": "get_weather", "description": "Météo actuelle — 天气", "parameters": {"type": "object", "properties": {"location": {"type": "string", "description": "City, e.g. \"Paris\""}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["location"]}}}, {"type": "function", "function": {"name": "search_code", "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "max_results": {"type": "integer", "default": 10}, "threshold": {"type": "number", "default": 0.5}}, "required": []}}}]"##;

/// Whitespace control: `trim_blocks`, `lstrip_blocks`, `-` markers, `break`.
pub(super) const WS_TEMPLATE: &str = r##"{%- for message in messages %}
    {%- if message.role == 'system' %}
        {{- '[SYS] ' + message.content.strip() + '\n' }}
    {%- elif message.tool_calls is defined %}
        {% for call in message.tool_calls %}
            {% if loop.index > 1 %}{% break %}{% endif %}
    {{ call.function.name }}({{ call.function.arguments | tojson }})
        {% endfor %}
    {%- else %}
  {{ message.role | upper }}: {{ message.content }}
    {% endif %}
{%- endfor %}
{% if add_generation_prompt %}ASSISTANT:{% endif %}
"##;

pub(super) const WS_EXPECTED: &str = r##"[SYS] You are nice.
  USER: hi
    get_weather({"location": "Zürich", "unit": "celsius", "days": 3, "ratio": 1.0, "flags": [true, false, null], "nested": {"z": 1, "a": "x\ny\t\"q\""}})
  USER: bye
ASSISTANT:"##;

pub(super) const WS_MESSAGES: &str = r##"[{"role": "system", "content": "You are nice. "}, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"location": "Zürich", "unit": "celsius", "days": 3, "ratio": 1.0, "flags": [true, false, null], "nested": {"z": 1, "a": "x\ny\t\"q\""}}}}, {"name": "search_code", "arguments": {"query": "fn main", "threshold": 2.5e-05}}]}, {"role": "user", "content": "bye"}]"##;
