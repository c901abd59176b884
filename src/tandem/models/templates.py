"""Chat templates of the built-in models, written for Tandem (Jinja, as in tokenizer_config.json).

Both accept OpenAI-style messages: ``content`` is a string or a list of parts
``{"type": "text", "text": ...}``, ``{"type": "image_url", ...}`` or
``{"type": "image"}`` (and, for the Qwen template, ``{"type": "video_url", ...}``).
Every image or video part renders exactly one anchor token, which the gateway (or the
worker) later expands to the item's token run.
"""

from __future__ import annotations

# Qwen-VL style turns: <|im_start|>role\n ... <|im_end|>\n, images wrapped in
# vision markers around a single <|image_pad|> anchor. With tools, the family's format:
# a system turn lists them in <tools>, the assistant calls them in <tool_call> blocks
# (JSON with "name" and "arguments"), and tool results come back as a user turn of
# <tool_response> blocks. A developer message reads as a system one.
QWEN3_VL_CHAT_TEMPLATE = r"""
{%- macro render_content(content) -%}
  {%- if content is string -%}
    {{- content -}}
  {%- elif content is not none -%}
    {%- for part in content -%}
      {%- if part['type'] == 'text' -%}
        {{- part['text'] -}}
      {%- elif part['type'] in ['image', 'image_url'] -%}
        {{- '<|vision_start|><|image_pad|><|vision_end|>' -}}
      {%- elif part['type'] in ['video', 'video_url'] -%}
        {{- '<|vision_start|><|video_pad|><|vision_end|>' -}}
      {%- else -%}
        {{- raise_exception('unsupported content part type: ' + part['type']) -}}
      {%- endif -%}
    {%- endfor -%}
  {%- endif -%}
{%- endmacro -%}
{%- set first_is_system = messages and messages[0]['role'] in ['system', 'developer'] -%}
{%- if tools -%}
  {{- '<|im_start|>system\n' -}}
  {%- if first_is_system -%}
    {{- render_content(messages[0]['content']) + '\n\n' -}}
  {%- endif -%}
  {{- '# Tools\n\nThese functions are available; ' -}}
  {{- 'their signatures are listed in <tools></tools>:\n<tools>' -}}
  {%- for tool in tools -%}
    {{- '\n' + (tool | tojson) -}}
  {%- endfor -%}
  {{- '\n</tools>\n\nTo call a function, answer with a JSON object holding its name and ' -}}
  {{- 'arguments in <tool_call></tool_call> tags:\n<tool_call>\n' -}}
  {{- '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
  {%- set role = 'system' if message['role'] == 'developer' else message['role'] -%}
  {%- if loop.first and first_is_system and tools -%}
    {#- already rendered above, with the tools -#}
  {%- elif role == 'tool' -%}
    {%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' -%}
      {{- '<|im_start|>user' -}}
    {%- endif -%}
    {{- '\n<tool_response>\n' + render_content(message['content']) + '\n</tool_response>' -}}
    {%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' -%}
      {{- '<|im_end|>\n' -}}
    {%- endif -%}
  {%- else -%}
    {{- '<|im_start|>' + role + '\n' + render_content(message['content']) -}}
    {%- if role == 'assistant' and message.get('tool_calls') -%}
      {%- for call in message['tool_calls'] -%}
        {%- set call = call['function'] if call.get('function') else call -%}
        {%- if loop.first and message['content'] -%}
          {{- '\n' -}}
        {%- elif not loop.first -%}
          {{- '\n' -}}
        {%- endif -%}
        {{- '<tool_call>\n{"name": "' + call['name'] + '", "arguments": ' -}}
        {%- if call['arguments'] is string -%}
          {{- call['arguments'] -}}
        {%- else -%}
          {{- call['arguments'] | tojson -}}
        {%- endif -%}
        {{- '}\n</tool_call>' -}}
      {%- endfor -%}
    {%- endif -%}
    {{- '<|im_end|>\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\n' -}}
{%- endif -%}
""".strip()

# LLaVA-1.5 conversation style: "USER: <image>\n{text} ASSISTANT: {reply}</s>".
# Images of a turn come first, one anchor line each, then the turn's text parts. LLaVA-1.5
# has no tool format of its own; the built-in model takes the <tools> / <tool_call> /
# <tool_response> one of the Qwen template, in a system preamble and the turns.
LLAVA_CHAT_TEMPLATE = r"""
{%- macro texts(content) -%}
  {%- if content is string -%}
    {{- content -}}
  {%- elif content is not none -%}
    {%- for part in content if part['type'] == 'text' -%}
      {{- part['text'] -}}{{- '\n' if not loop.last else '' -}}
    {%- endfor -%}
  {%- endif -%}
{%- endmacro -%}
{{- bos_token -}}
{%- if tools -%}
  {{- 'Functions you may call, listed in <tools></tools>:\n<tools>' -}}
  {%- for tool in tools -%}
    {{- '\n' + (tool | tojson) -}}
  {%- endfor -%}
  {{- '\n</tools>\nCall one as <tool_call>\n' -}}
  {{- '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>\n' -}}
{%- endif -%}
{%- for message in messages -%}
  {%- if message['content'] is not string and message['content'] is not none -%}
    {%- for part in message['content'] -%}
      {%- if part['type'] not in ['text', 'image', 'image_url'] -%}
        {{- raise_exception('unsupported content part type: ' + part['type']) -}}
      {%- endif -%}
    {%- endfor -%}
  {%- endif -%}
  {%- if message['role'] in ['system', 'developer'] -%}
    {{- texts(message['content']) + ' ' -}}
  {%- elif message['role'] == 'assistant' -%}
    {{- 'ASSISTANT: ' + texts(message['content']) -}}
    {%- for call in message.get('tool_calls') or [] -%}
      {%- set call = call['function'] if call.get('function') else call -%}
      {{- '<tool_call>\n{"name": "' + call['name'] + '", "arguments": ' -}}
      {{- call['arguments'] if call['arguments'] is string else call['arguments'] | tojson -}}
      {{- '}\n</tool_call>' -}}
    {%- endfor -%}
    {{- eos_token -}}
  {%- elif message['role'] == 'tool' -%}
    {{- 'USER: <tool_response>\n' + texts(message['content']) + '\n</tool_response> ' -}}
  {%- else -%}
    {{- 'USER: ' -}}
    {%- if message['content'] is not string and message['content'] is not none -%}
      {%- for part in message['content'] if part['type'] in ['image', 'image_url'] -%}
        {{- '<image>\n' -}}
      {%- endfor -%}
    {%- endif -%}
    {{- texts(message['content']) + ' ' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- 'ASSISTANT:' -}}
{%- endif -%}
""".strip()
