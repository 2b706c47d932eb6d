"""Writes tests/fixtures/smollm2/greedy.json: transformers' greedy continuations of five
chat prompts by SmolLM2-135M-Instruct (loaded from its GGUF, dequantized to float32, eager
attention), 40 new tokens each, with the prompt token ids as rendered by the model's own
chat template. tests/test_generate.c checks marlhf's KV-cache decoder reproduces them.

usage: .venv-tools/bin/python tools/make_smollm2_generation_reference.py [GGUF]
"""
import json
import os
import sys

import torch
import transformers

root = os.path.join(os.path.dirname(__file__), "..")
gguf = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "models/SmolLM2-135M-Instruct.Q4_1.gguf")
directory, name = os.path.split(os.path.abspath(gguf))
tokenizer = transformers.AutoTokenizer.from_pretrained(directory, gguf_file=name)
model = transformers.AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32,
                                                          attn_implementation="eager").eval()
questions = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in one sentence.",
    "List three prime numbers.",
    "How do I reverse a list in Python?",
]
cases = []
for question in questions:
    text = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                         add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        # An explicit attention mask: SmolLM2's pad id is also <|im_end|>, which the prompt
        # contains, and generate() would otherwise mask those tokens out.
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=40, do_sample=False, eos_token_id=None,
                             pad_token_id=tokenizer.pad_token_id)
    cases.append({"question": question, "prompt": text, "prompt_ids": ids, "greedy_ids": out[0, len(ids):].tolist(),
                  "greedy_text": tokenizer.decode(out[0, len(ids):])})
path = os.path.join(root, "tests/fixtures/smollm2/greedy.json")
with open(path, "w") as f:
    json.dump(cases, f, indent=1, ensure_ascii=False)
print("wrote", path)
