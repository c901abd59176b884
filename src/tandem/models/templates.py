"""Chat templates of the built-in models, written for Tandem (Jinja, as in tokenizer_config.json).

Both accept OpenAI-style messages: ``content`` is a string or a list of parts
``{"type": "text", "text": ...}``, ``{"type": "image_url", ...}`` or
``{"type": "image"}``. Every image part renders exactly one anchor token, which
the gateway (or the worker) later expands to the image's token run.
"""

from __future__ import annotations

# Qwen-VL style turns: <|im_start|>role\n ... <|im_end|>\n, images wrapped in
# vision markers around a single <|image_pad|> anchor.
QWEN3_VL_CHAT_TEMPLATE = r"""
{%- for message in messages -%}
  {{- '<|im_start|>' + message['role'] + '\n' -}}
  {%- if message['content'] is string -%}
    {{- message['content'] -}}
  {%- elif message['content'] is not none -%}
    {%- for part in message['content'] -%}
      {%- if part['type'] == 'text' -%}
        {{- part['text'] -}}
      {%- elif part['type'] in ['image', 'image_url'] -%}
        {{- '<|vision_start|><|image_pad|><|vision_end|>' -}}
      {%- else -%}
        {{- raise_exception('unsupported content part type: ' + part['type']) -}}
      {%- endif -%}
    {%- endfor -%}
  {%- endif -%}
  {{- '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\n' -}}
{%- endif -%}
""".strip()

# LLaVA-1.5 conversation style: "USER: <image>\n{text} ASSISTANT: {reply}</s>".
# Images of a turn come first, one anchor line each, then the turn's text parts.
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
{%- for message in messages -%}
  {%- if message['content'] is not string and message['content'] is not none -%}
    {%- for part in message['content'] -%}
      {%- if part['type'] not in ['text', 'image', 'image_url'] -%}
        {{- raise_exception('unsupported content part type: ' + part['type']) -}}
      {%- endif -%}
    {%- endfor -%}
  {%- endif -%}
  {%- if message['role'] == 'system' -%}
    {{- texts(message['content']) + ' ' -}}
  {%- elif message['role'] == 'assistant' -%}
    {{- 'ASSISTANT: ' + texts(message['content']) + eos_token -}}
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
