"""Reference distributions of gen/sampler.c's sampling with the penalties and min-p,
computed with transformers' own logits processors (developers only; CI never runs Python):
RepetitionPenaltyLogitsProcessor over the prompt and the answer so far, then OpenAI's
presence and frequency penalties over the answer as vLLM applies them after it
(vllm/model_executor/layers/utils.py apply_penalties: logits -= frequency_penalty *
counts + presence_penalty * (counts > 0); written out here, vLLM is not installed), then
TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper and MinPLogitsWarper in the order
transformers' generate() applies them, and the softmax of what is left.
Writes tests/fixtures/sampler/logits_processors.json: [{"logits", "prompt", "generated",
"temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty",
"frequency_penalty", "probs"}].
usage: /path/to/venv/bin/python tools/make_sampler_fixtures.py
"""
import json
import os
import random

import torch
from transformers.generation.logits_process import (MinPLogitsWarper, RepetitionPenaltyLogitsProcessor,
                                                    TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

rng = random.Random(7)
V = 40


def case(temperature, top_k, top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty):
    logits = [rng.gauss(0.0, 2.0) for _ in range(V)]
    prompt = [rng.randrange(V) for _ in range(6)]
    generated = [rng.randrange(V) for _ in range(9)] + prompt[:2]  # repeats within and across
    scores = torch.tensor([logits], dtype=torch.float32)
    input_ids = torch.tensor([prompt + generated])
    if repetition_penalty != 1.0:
        scores = RepetitionPenaltyLogitsProcessor(penalty=repetition_penalty)(input_ids, scores)
    counts = torch.zeros(V)
    for t in generated:
        counts[t] += 1
    scores = scores - frequency_penalty * counts - presence_penalty * (counts > 0).float()
    if temperature != 1.0:
        scores = TemperatureLogitsWarper(temperature)(input_ids, scores)
    if top_k:
        scores = TopKLogitsWarper(top_k=top_k)(input_ids, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p=top_p)(input_ids, scores)
    if min_p:
        scores = MinPLogitsWarper(min_p=min_p)(input_ids, scores)
    probs = torch.softmax(scores.double(), dim=-1)[0]
    return {"logits": logits, "prompt": prompt, "generated": generated, "temperature": temperature, "top_k": top_k,
            "top_p": top_p, "min_p": min_p, "repetition_penalty": repetition_penalty,
            "presence_penalty": presence_penalty, "frequency_penalty": frequency_penalty, "probs": probs.tolist()}


cases = [
    case(1.0, 0, 1.0, 0.0, 1.3, 0.0, 0.0),
    case(0.7, 0, 1.0, 0.0, 1.0, 0.5, 0.3),
    case(1.0, 0, 1.0, 0.1, 1.0, 0.0, 0.0),
    case(1.2, 10, 0.9, 0.05, 1.1, 0.2, 0.4),
    case(0.8, 0, 0.8, 0.2, 0.9, -0.5, 0.0),
    case(1.0, 5, 1.0, 0.3, 2.0, 0.0, -0.3),
]
path = os.path.join(os.path.dirname(__file__), "..", "tests/fixtures/sampler/logits_processors.json")
with open(path, "w") as f:
    json.dump(cases, f)
print("wrote", path, len(cases), "cases")
