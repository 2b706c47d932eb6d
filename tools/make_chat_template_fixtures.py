#!/usr/bin/env python3
"""Writes tests/fixtures/chat_templates/cases.json for tests/test_chat_template.c.

Run with the tools environment:  .venv-tools/bin/python tools/make_chat_template_fixtures.py
The output is deterministic: re-running it gives an identical file.

Why: src/chat/ renders chat templates without a Jinja engine, with C code written per
template family, and must give exactly what transformers' apply_chat_template gives
(tokenize=False). The reference here is transformers itself: each real template string
below is set as `chat_template` on a tokenizer object (a tiny WordLevel tokenizer that
only carries the model's bos/eos tokens, since the template sees nothing else of the
tokenizer) and rendered on a set of conversations. A conversation the template refuses
(jinja2's TemplateError from raise_exception) is stored as an expected error.

The template strings are those published with the models (tokenizer_config.json /
GGUF `tokenizer.chat_template`), written down here as the decoded strings; SmolLM2's is
also checked against the GGUF in models/ when that file is present.

cases.json:
  templates      id (the name marlhf gives the variant, unless "variant" gives it: two
                 published sources of one variant), family, models that publish it,
                 source, bos_token/eos_token (null: the tokenizer has none, so the template
                 sees an undefined name, which renders as ""), and normalized_fnv1a64: the
                 64-bit FNV-1a hash of the source after the whitespace normalisation that
                 src/chat/chat_template.c uses for recognition (see normalize_source below),
                 so the C test checks both sides normalise alike.
  conversations  lists of {role, content}; the last ones (THINKING_CONVERSATIONS) are
                 rendered by the templates with a thinking switch (Qwen3) only.
  cases          {template, conversation (index), add_generation_prompt, expected} or
                 {..., error} with the template's exception message; for Qwen3 also with
                 "enable_thinking": true or false (absent: not passed, undefined in Jinja);
                 for Llama 3.2 with "date_string" (passed, so the date is not today's). A
                 tool case has "tool_conversation" (an index into tool_conversations) instead.
  tool_conversations  {tools (a list, or null: not passed), messages (with tool_calls whose
                 arguments are dicts, and role "tool")}, rendered by TOOL_TEMPLATES.
  prompt_formats the paper's plain dataset prompts (DeepSpeed-Chat raw_datasets.py rules,
                 spec section 3.2), computed here by the same concatenation:
                   tldr:            {subreddit (or null), post, is_article, expected}
                   webgpt_prompt:   {question, expected}
                   webgpt_response: {answer, expected}  (citations stripped, one space before)
"""
import json
import re
import sys
from pathlib import Path

import jinja2
import transformers
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "tests" / "fixtures" / "chat_templates" / "cases.json"
SMOLLM2_GGUF = REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"

# --- the published templates -------------------------------------------------------
# Written as the decoded strings. In raw strings (r"...") a "\n" is the two characters
# backslash-n, i.e. a newline escape inside a Jinja string literal (that is how those
# tokenizer_config.json files spell it, "\\n" in JSON); in ordinary strings it is a real
# newline (JSON "\n"). Both render the same; recognition treats them alike.

# HuggingFaceTB/SmolLM2-135M-Instruct (and -360M, -1.7B): ChatML with a default system turn.
SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Qwen/Qwen2-0.5B-Instruct (and the other Qwen2 instruct sizes; Qwen1.5-Chat has the same).
QWEN2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Qwen/Qwen2.5-0.5B-Instruct (and the other Qwen2.5 instruct sizes). The tool branches are
# never taken here (no tools are passed, no message has tool_calls or role "tool").
QWEN2_5 = r"""{%- if tools %}
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
"""

# teknium/OpenHermes-2.5-Mistral-7B: plain ChatML, no default system turn.
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# meta-llama/Llama-2-7b-chat-hf (and -13b, -70b). Note the two spaces in "' '  + content".
LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    r"{% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
)

# meta-llama/Meta-Llama-3-8B-Instruct (and -70B).
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

# meta-llama/Llama-3.1-8B-Instruct (and -70B, -405B). date_string defaults to "26 Jul 2024".
LLAMA3_1 = r"""{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\n\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- "<|python_tag|>" + tool_call.name + ".call(" }}
            {%- for arg_name, arg_val in tool_call.arguments | items %}
                {{- arg_name + '="' + arg_val + '"' }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- endif %}
                {%- endfor %}
            {{- ")" }}
        {%- else  %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- '{"name": "' + tool_call.name + '", ' }}
            {{- '"parameters": ' }}
            {{- tool_call.arguments | tojson }}
            {{- "}" }}
        {%- endif %}
        {%- if builtin_tools is defined %}
            {#- This means we're in ipython mode #}
            {{- "<|eom_id|>" }}
        {%- else %}
            {{- "<|eot_id|>" }}
        {%- endif %}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

# meta-llama/Llama-3.2-1B-Instruct and -3B-Instruct, as llama.cpp keeps it in
# models/templates/meta-llama-Llama-3.2-3B-Instruct.jinja: Llama 3.1's without the builtin
# tools, the date from transformers' strftime_now (today). Its cases pass date_string
# "26 Jul 2024" so that the fixture does not depend on the day it was written.
LLAMA3_2 = r"""{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

# google/gemma-2b-it and gemma-7b-it (Gemma 1); gemma-2-2b-it, -9b-it, -27b-it publish the
# same string. A system turn is refused.
GEMMA = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
)

# google/gemma-3-1b-it (and -4b-it, -12b-it, -27b-it): the system turn is folded into the
# first user turn. The image branch is never taken (string contents only).
GEMMA3 = r"""{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""

# HuggingFaceH4/zephyr-7b-beta; TinyLlama/TinyLlama-1.1B-Chat-v1.0 publishes the same string.
ZEPHYR = (
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n"
    r"{{ '<|user|>\n' + message['content'] + eos_token }}" "\n"
    "{% elif message['role'] == 'system' %}\n"
    r"{{ '<|system|>\n' + message['content'] + eos_token }}" "\n"
    "{% elif message['role'] == 'assistant' %}\n"
    r"{{ '<|assistant|>\n'  + message['content'] + eos_token }}" "\n"
    "{% endif %}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}"
)

# The paper's plain formats (DeepSpeed-Chat, spec section 3.2) written as chat templates by
# marlhf, so that transformers renders them too. HH-RLHF (Dahoas/full-hh-rlhf `prompt`):
# "\n\nHuman: q\n\nAssistant: a ... \n\nAssistant:"; the response (" " + text) is appended
# directly. WebGPT: " Human: " + q + " Assistant:"; several turns continue the same way.
PLAIN_TURNS = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ 'USER' + message['content'] }}"
    "{% else %}{{ 'ASSISTANT' + message['content'] }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'PROMPT' }}{% endif %}"
)
HH = (PLAIN_TURNS.replace("'USER'", r"'\n\nHuman: '").replace("'ASSISTANT'", r"'\n\nAssistant: '")
      .replace("'PROMPT'", r"'\n\nAssistant:'"))
WEBGPT = (PLAIN_TURNS.replace("'USER'", "' Human: '").replace("'ASSISTANT'", "' Assistant: '")
          .replace("'PROMPT'", "' Assistant:'"))

# Qwen3 (the hybrid-thinking models: Qwen/Qwen3-0.6B ... Qwen3-32B, Qwen3-30B-A3B,
# Qwen3-235B-A22B). Two published versions; the tool branches are never taken here.
#
# QWEN3_INITIAL: the template of the first release (April 2025), as llama.cpp keeps it in
# models/templates/Qwen-Qwen3-0.6B.jinja (also the string optimum-intel matches against).
QWEN3_INITIAL = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in message.content %}
                {%- set content = message.content.split('</think>')[-1].lstrip('\n') %}
                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
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
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""

# QWEN3: the revised template of the Qwen3 repositories' later tokenizer_config.json (it
# tolerates non-string contents: `message.content is string`, `reasoning_content is
# string`), transcribed from copies of that file's "chat_template" quoted in public code.
# For string contents and no tools it renders as QWEN3_INITIAL does.
QWEN3 = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""

TEMPLATES = [
    # id, family, models, source, bos_token, eos_token
    ("smollm2", "chatml", ["HuggingFaceTB/SmolLM2-135M-Instruct"], SMOLLM2, "<|im_start|>", "<|im_end|>"),
    ("qwen2", "chatml", ["Qwen/Qwen2-0.5B-Instruct"], QWEN2, None, "<|im_end|>"),
    ("qwen2.5", "chatml", ["Qwen/Qwen2.5-0.5B-Instruct"], QWEN2_5, None, "<|im_end|>"),
    ("chatml", "chatml", ["teknium/OpenHermes-2.5-Mistral-7B"], CHATML, "<s>", "<|im_end|>"),
    ("llama2", "llama2", ["meta-llama/Llama-2-7b-chat-hf"], LLAMA2, "<s>", "</s>"),
    ("llama3", "llama3", ["meta-llama/Meta-Llama-3-8B-Instruct"], LLAMA3, "<|begin_of_text|>", "<|eot_id|>"),
    ("llama3.1", "llama3", ["meta-llama/Llama-3.1-8B-Instruct"], LLAMA3_1, "<|begin_of_text|>", "<|eot_id|>"),
    ("llama3.2", "llama3", ["meta-llama/Llama-3.2-1B-Instruct", "meta-llama/Llama-3.2-3B-Instruct"], LLAMA3_2,
     "<|begin_of_text|>", "<|eot_id|>"),
    ("gemma", "gemma", ["google/gemma-2b-it", "google/gemma-7b-it", "google/gemma-2-2b-it"], GEMMA, "<bos>", "<eos>"),
    ("gemma3", "gemma", ["google/gemma-3-1b-it"], GEMMA3, "<bos>", "<eos>"),
    ("zephyr", "zephyr", ["HuggingFaceH4/zephyr-7b-beta", "TinyLlama/TinyLlama-1.1B-Chat-v1.0"], ZEPHYR, "<s>", "</s>"),
    ("hh", "hh", ["marlhf: Anthropic HH-RLHF transcript (Dahoas/full-hh-rlhf prompts)"], HH, None, None),
    ("webgpt", "webgpt", ["marlhf: DeepSpeed-Chat WebGPT prompt"], WEBGPT, None, None),
    ("qwen3", "qwen3", ["Qwen/Qwen3-0.6B", "Qwen/Qwen3-8B"], QWEN3, None, "<|im_end|>"),
    ("qwen3-initial", "qwen3", ["Qwen/Qwen3-0.6B (first release)"], QWEN3_INITIAL, None, "<|im_end|>"),
]
# Fixture ids whose variant (the name marlhf gives the template) is not the id itself:
# two published sources that render alike are one variant.
VARIANT_OF_ID = {"qwen3-initial": "qwen3"}
# Families whose templates read the `enable_thinking` variable: their cases are rendered
# with it undefined (the template's default), true and false.
THINKING_FAMILIES = {"qwen3"}


def conv(*turns):
    return [{"role": role, "content": content} for role, content in turns]


S, U, A = "system", "user", "assistant"
CONVERSATIONS = [
    conv((U, "Hello")),
    conv((S, "You are a pirate."), (U, "Hi there")),
    conv((U, "What is 2+2?"), (A, "4"), (U, "And 3+3?")),
    conv((S, "Be brief."), (U, "What is 2+2?"), (A, "4"), (U, "And 3+3?")),
    conv((U, "Name a colour."), (A, "Blue.")),
    conv((S, "Line one\nLine two\n"), (U, "first\n\nsecond\n"), (A, "\nanswer\n"), (U, "more\n")),
    conv((U, "Héllo wörld — 你好 🌍"), (A, "¡Olé! ñ ß 𝔘")),
    conv((U, "   padded   "), (A, "\t tabbed \t"), (U, " x ")),
    conv((S, "  sys with spaces  "), (U, "\r\nwindows\r\n")),
    conv((U, "\u3000wide\u00a0"), (A, "\u2028sep\u200b"), (U, "\x1c\x85ctl\x0b\x0c")),
    conv((U, "   \n\t ")),
    conv((U, "")),
    conv((S, ""), (U, "")),
    conv((U, ""), (A, ""), (U, "q")),
    conv((S, "Only a system message")),
    conv((A, "I start"), (U, "ok")),
    conv((U, "a"), (U, "b")),
    conv((U, "a"), (S, "a note")),
    conv((S, "one"), (S, "two"), (U, "q")),
    conv((U, "q"), (A, "r"), (S, "mid"), (U, "q2")),
    conv((U, "{{ not jinja }} {% raw %} <|im_end|> [/INST] \\n {# x #}")),
]

# Rendered by the thinking templates only (after CONVERSATIONS in the fixture): reasoning
# in assistant turns, which Qwen3 keeps after the last user query and drops before it
# (content.split('</think>'), the "\n" stripping), and user turns that are tool responses
# (`<tool_response>...</tool_response>`), which do not count as that query.
THINKING_CONVERSATIONS = [
    conv((U, "What is 2+2?"), (A, "<think>\nAdd them.\n</think>\n\n4"), (U, "And 3+3?")),
    conv((S, "Be brief."), (U, "q"), (A, "<think>\nreason\n</think>\n\nanswer")),
    conv((U, "q"), (A, "<think>\n\n</think>\n\nfirst"), (A, "second"), (A, "<think>r3</think>third"),
         (A, "last")),
    conv((U, "q"), (A, "<think>one</think>middle<think>two</think>\n\nfinal"), (U, "q2"),
         (A, "pre<think>\n\nr\n\n</think>\n\n\ncontent\n")),
    conv((U, "q"), (A, "no opening tag</think>answer"), (A, "<think>one</think>middle<think>two</think>\n\nfinal"),
         (A, "<think>never closed")),
    conv((U, "q"), (A, "<think> </think>spaces count"), (A, "<think>\n</think>\n")),
    conv((S, "\u3000sys\u00a0"), (U, "\u2028 q \n"),
         (A, "\n\u00a0<think>\u3000r\u3000</think>\u00a0\nans\n"), (A, "<think>\r\nr\r\n</think>\r\n\r\nans")),
    conv((U, "q"), (A, "<think>r</think>a"), (U, "<tool_response>\nresult\n</tool_response>")),
    conv((U, "<tool_response>x</tool_response>"), (A, "<think>r</think>a")),
    conv((U, "<tool_response>"), (A, "<think>r</think>a"), (U, "ok </tool_response>")),
    conv((S, "<think>system</think>"), (U, "<think>user</think>"), (A, "</think>")),
    conv((A, "<think>r</think>alone")),
    conv((U, "q"), (A, "\n\nno reasoning, newlines first\n")),
]


# --- tool calling ------------------------------------------------------------------------
# Templates that render OpenAI-style tools (the `tools` argument of apply_chat_template),
# assistant messages with tool_calls and messages of role "tool": their cases are rendered
# on TOOL_CONVERSATIONS too. A tool call's arguments are a dict here, as vLLM hands them to
# the template (it json.loads the OpenAI API's arguments string first) and as transformers
# documents them; marlhf's server does the same.
TOOL_TEMPLATES = {"qwen2.5", "qwen3", "qwen3-initial", "llama3.1", "llama3.2"}
# Templates whose date is today's (strftime_now): their cases pass this date_string.
FIXED_DATE = {"llama3.2": "26 Jul 2024"}


def tool(name, description=None, parameters=None, **extra):
    function = {"name": name}
    if description is not None:
        function["description"] = description
    if parameters is not None:
        function["parameters"] = parameters
    function.update(extra)
    return {"type": "function", "function": function}


def call(name, arguments, call_id=None):
    entry = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if call_id is not None:
        entry = {"id": call_id, **entry}
    return entry


def assistant_calls(content, *calls):
    return {"role": "assistant", "content": content, "tool_calls": list(calls)}


def tool_result(content, call_id="call_1"):
    return {"role": "tool", "tool_call_id": call_id, "content": content}


WEATHER = tool("get_weather", "Get the current weather in a given city.", {
    "type": "object",
    "properties": {
        "city": {"type": "string", "description": "The city, e.g. \"Paris\" or \"São Paulo\""},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
    },
    "required": ["city"],
})
# Numbers of every shape Python's json.dumps writes (floats by repr), nested containers,
# empty ones, escapes and non-ASCII text, keys in a non-sorted order.
ODD = tool("odd_numbers", "Escapes: \" \\ / \t\n\r\b\f \u0001 \u001f \u007f \u2028 — <tool_call> ü 🌍", {
    "zeta": 1, "alpha": -0.0, "numbers": [0.1, 1e-07, 1e16, 1e15, 100.0, 2.5e-05, 123456789.125, -3, 0, 1e300,
                                           5e-324, 0.0001, 12345678901234567],
    "empty_object": {}, "empty_list": [], "flags": [True, False, None], "nested": {"a": [{"b": {}}, []]},
})
NO_PARAMETERS = tool("get_time")
SEARCH = tool("search", "Search the web.", {"type": "object", "properties": {"query": {"type": "string"}}},
              strict=True)

TOOL_CONVERSATIONS = [
    {"tools": [WEATHER], "messages": conv((U, "What's the weather in Paris?"))},
    {"tools": [WEATHER, SEARCH, NO_PARAMETERS], "messages": conv((S, "Be brief."), (U, "  Weather in Oslo?\n"))},
    {"tools": [ODD], "messages": conv((U, "q"))},
    {"tools": [WEATHER], "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        assistant_calls("", call("get_weather", {"city": "Paris"}, "call_1")),
        tool_result("{\"temperature\": 22, \"unit\": \"celsius\"}"),
    ]},
    {"tools": [WEATHER, SEARCH], "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Weather in Paris and Oslo?"},
        assistant_calls("I will look both up.", call("get_weather", {"city": "Paris", "unit": "celsius"}, "a"),
                        call("get_weather", {"city": "Oslo"}, "b")),
        tool_result("22", "a"),
        tool_result("-3", "b"),
        {"role": "assistant", "content": "Paris 22, Oslo -3."},
        {"role": "user", "content": "Thanks"},
    ]},
    # No tools in this request, but a history that used them.
    {"tools": None, "messages": [
        {"role": "user", "content": "Time?"},
        assistant_calls("", call("get_time", {})),
        tool_result("12:00"),
        {"role": "assistant", "content": "It is noon."},
        {"role": "user", "content": "And now?"},
    ]},
    {"tools": [ODD], "messages": [
        {"role": "user", "content": "odd"},
        assistant_calls("", call("odd_numbers", {"s": "quote \" back \\ nl \n tab \t ü </tool_call>", "x": 1.5,
                                                 "list": [1, 2.0, None, True], "nested": {"k": {}}})),
        tool_result("  padded result  \n"),
    ]},
    # Qwen3 reasoning before a call, after the last query: kept.
    {"tools": [WEATHER], "messages": [
        {"role": "user", "content": "Weather in Rome?"},
        assistant_calls("<think>\nI should call the tool.\n</think>\n\n", call("get_weather", {"city": "Rome"})),
        tool_result("30"),
        assistant_calls("<think>\nAnother check.\n</think>\n\nChecking again.", call("get_weather", {"city": "Rome"})),
        tool_result("31"),
    ]},
    # A tool message first; a tool message followed by a user turn.
    {"tools": None, "messages": [tool_result("orphan"), {"role": "user", "content": "q"}]},
    # Only a system message: Llama 3.1 has no user message to put the tools in.
    {"tools": [WEATHER], "messages": conv((S, "sys only"))},
    # Empty tools list: no tools (falsy in the templates, though "is not none" in Llama 3.1's).
    {"tools": [], "messages": conv((U, "hi"))},
]


def make_tokenizer(bos, eos):
    vocab = {"<unk>": 0}
    for token in (bos, eos):
        if token is not None and token not in vocab:
            vocab[token] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=bos, eos_token=eos, unk_token="<unk>")


def normalize_source(source):
    """The recognition key of src/chat/chat_template.c. Whitespace that cannot reach the
    output is normalised; what can is kept:
      - inside a tag ({{ }}, {% %}, {# #}) but outside string literals, a run of ASCII
        whitespace becomes one space, and none is kept next to the delimiters (nor
        between an opening delimiter and its "-"/"+", or a "-"/"+" and the closing one);
      - inside a string literal everything is kept, a "\\n" escape written as the
        newline it stands for (other escapes as written);
      - text outside tags is kept as it is;
      - whitespace at both ends of the source is dropped."""
    out = []
    i, n = 0, len(source)
    closers = {"{{": "}}", "{%": "%}", "{#": "#}"}
    while i < n:
        opener = source[i:i + 2]
        if opener not in closers:
            out.append(source[i])
            i += 1
            continue
        closer = closers[opener]
        out.append(opener)
        i += 2
        if i < n and source[i] in "-+":
            out.append(source[i])
            i += 1
        pending_space, started = False, False
        while i < n:
            c = source[i]
            rest = source[i:]
            if rest.startswith(closer) or (c in "-+" and rest[1:].startswith(closer)):
                length = len(closer) + (0 if rest.startswith(closer) else 1)
                out.append(rest[:length])
                i += length
                break
            if c in " \t\n\r\v\f":
                pending_space = True
                i += 1
                continue
            if pending_space and started:
                out.append(" ")
            pending_space, started = False, True
            if opener != "{#" and c in "'\"":
                out.append(c)
                i += 1
                while i < n and source[i] != c:
                    if source[i] == "\\" and i + 1 < n:
                        out.append("\n" if source[i + 1] == "n" else source[i:i + 2])
                        i += 2
                    else:
                        out.append(source[i])
                        i += 1
                if i < n:
                    out.append(c)
                    i += 1
                continue
            out.append(c)
            i += 1
    return "".join(out).strip(" \t\n\r\v\f")


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for byte in data:
        h ^= byte
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


# --- the paper's plain prompts (DeepSpeed-Chat raw_datasets.py, restated) -------------

def tldr_prompt(subreddit, post, is_article):
    text = "ARTICLE\n" if is_article else "POST\n"
    if subreddit is not None:
        text += "Subreddit: r/" + subreddit + "\n"
    return text + post + "\nTL;DR: "


def webgpt_prompt(question):
    return " Human: " + question + " Assistant:"


def webgpt_response(answer):
    answer = re.sub(r" [\(\[].*?[\)\]]", "", answer)
    answer = re.sub(r"[\(\[].*?[\)\]]", "", answer)
    return " " + answer


TLDR_CASES = [
    ("relationships", "My boyfriend and I have been together for 2 years.\nWhat should I do?", False),
    (None, "A post without a subreddit.", False),
    ("AskReddit", "", False),
    ("", "Empty subreddit name is kept as a line.", False),
    (None, "(CNN) -- An article body.\n\nSecond paragraph.", True),
    ("news", "  leading and trailing spaces kept  ", True),
    ("tifu", "Unicode: café — 日本語 🙂", False),
]
WEBGPT_QUESTIONS = ["Why is the sky blue?", "", "  spaced  ", "Line\nbreak and ünïcode?"]
WEBGPT_ANSWERS = [
    "The sky is blue because of Rayleigh scattering [1][2].",
    "Plain answer with no citations.",
    "Cited (Smith, 2010) and [3] and a parenthetical (like this).",
    "[1] Leading citation and trailing one [2]",
    "Unclosed [bracket stays",
    "Nested [a [b] c] text",
    "Across lines [1\n2] and (x\ny) stay",
    "Mixed [open paren) closes",
    "",
    "Two  spaces  [1]  kept",
]


def main():
    if SMOLLM2_GGUF.exists():
        import gguf
        field = gguf.GGUFReader(str(SMOLLM2_GGUF)).fields["tokenizer.chat_template"]
        published = field.contents()
        if published != SMOLLM2:
            sys.exit(f"the SmolLM2 template written here differs from {SMOLLM2_GGUF}'s")
    else:
        print(f"note: {SMOLLM2_GGUF} not found; SmolLM2's template is not re-checked", file=sys.stderr)

    conversations = CONVERSATIONS + THINKING_CONVERSATIONS
    templates, cases = [], []
    for template_id, family, model_names, source, bos, eos in TEMPLATES:
        entry = {"id": template_id}
        if template_id in VARIANT_OF_ID:
            entry["variant"] = VARIANT_OF_ID[template_id]
        entry.update({
            "family": family, "models": model_names, "source": source,
            "bos_token": bos, "eos_token": eos,
            "normalized_fnv1a64": "%016x" % fnv1a64(normalize_source(source).encode("utf-8")),
        })
        templates.append(entry)
        tokenizer = make_tokenizer(bos, eos)
        tokenizer.chat_template = source
        thinking = family in THINKING_FAMILIES
        # None: enable_thinking not passed (undefined in the template).
        thinking_values = (None, True, False) if thinking else (None,)
        for index, conversation in enumerate(conversations if thinking else CONVERSATIONS):
            for add_generation_prompt in (False, True):
                for enable_thinking in thinking_values:
                    case = {"template": template_id, "conversation": index,
                            "add_generation_prompt": add_generation_prompt}
                    extra = {}
                    if enable_thinking is not None:
                        case["enable_thinking"] = extra["enable_thinking"] = enable_thinking
                    if template_id in FIXED_DATE:
                        case["date_string"] = extra["date_string"] = FIXED_DATE[template_id]
                    try:
                        case["expected"] = tokenizer.apply_chat_template(
                            conversation, tokenize=False, add_generation_prompt=add_generation_prompt, **extra)
                    except jinja2.exceptions.TemplateError as error:
                        case["error"] = str(error)
                    cases.append(case)

        if template_id in TOOL_TEMPLATES:
            for index, item in enumerate(TOOL_CONVERSATIONS):
                for add_generation_prompt in (False, True):
                    case = {"template": template_id, "tool_conversation": index,
                            "add_generation_prompt": add_generation_prompt}
                    extra = {}
                    if template_id in FIXED_DATE:
                        case["date_string"] = extra["date_string"] = FIXED_DATE[template_id]
                    try:
                        case["expected"] = tokenizer.apply_chat_template(
                            item["messages"], tools=item["tools"], tokenize=False,
                            add_generation_prompt=add_generation_prompt, **extra)
                    except jinja2.exceptions.TemplateError as error:
                        case["error"] = str(error)
                    cases.append(case)

    # The plain formats as templates must agree with DeepSpeed-Chat's own concatenation.
    for template_id, render_prompt in (("hh", lambda q: "\n\nHuman: " + q + "\n\nAssistant:"),
                                       ("webgpt", webgpt_prompt)):
        for case in cases:
            if "conversation" not in case:
                continue
            conversation = conversations[case["conversation"]]
            if case["template"] == template_id and case["add_generation_prompt"] and len(conversation) == 1 \
                    and conversation[0]["role"] == "user":
                assert case["expected"] == render_prompt(conversation[0]["content"]), case

    prompt_formats = {
        "tldr": [{"subreddit": s, "post": p, "is_article": a, "expected": tldr_prompt(s, p, a)}
                 for s, p, a in TLDR_CASES],
        "webgpt_prompt": [{"question": q, "expected": webgpt_prompt(q)} for q in WEBGPT_QUESTIONS],
        "webgpt_response": [{"answer": a, "expected": webgpt_response(a)} for a in WEBGPT_ANSWERS],
    }
    document = {
        "generator": "tools/make_chat_template_fixtures.py",
        "transformers": transformers.__version__,
        "jinja2": jinja2.__version__,
        "templates": templates,
        "conversations": conversations,
        "tool_conversations": TOOL_CONVERSATIONS,
        "cases": cases,
        "prompt_formats": prompt_formats,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(document, ensure_ascii=False, indent=1) + "\n"
    OUT.write_text(text, encoding="utf-8")
    errors = sum("error" in case for case in cases)
    print(f"{OUT.relative_to(REPO)}: {len(templates)} templates, {len(conversations)} conversations, "
          f"{len(cases)} cases ({errors} expected errors), {len(text.encode())} bytes")


if __name__ == "__main__":
    main()
