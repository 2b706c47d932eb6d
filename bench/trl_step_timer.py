"""What the TRL peers of the preference benchmarks share (bench/trl_dpo_step.py,
bench/trl_kto_step.py): per-step wall times from a Trainer callback, and the one JSON line
they print."""
import json
import resource
import time

from transformers import TrainerCallback


class StepTimer(TrainerCallback):
    def __init__(self):
        self.durations, self.started = [], None

    def on_step_begin(self, args, state, control, **kwargs):
        self.started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.durations.append(time.perf_counter() - self.started)


def train_and_report(trainer, timer, impl, fields):
    """Runs trainer.train() and prints its wall time, the mean step after the first and the
    process's peak resident memory, with `fields` (steps, batch, threads...)."""
    started = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - started
    later = timer.durations[1:] or timer.durations
    print(json.dumps({"impl": impl, **fields, "train_s": round(total, 2), "step_s": round(sum(later) / len(later), 3),
                      "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}))
