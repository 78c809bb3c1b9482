"""A generator of random answers for the harness tests: no model, exact control of samples."""

import threading
import time

import torch

from metagen.decoding import Cost, Generator
from metagen.decoding import capabilities as caps
from metagen.decoding.result import Completion, GenerationResult
from metagen.eval import Problem

PROBLEMS = [Problem(f"p{i}", f"question {i}", str(i % 3)) for i in range(5)]


class DiceGenerator(Generator):
    """Answers 'The answer is X' with X uniform in {0, 1, 2} from the rng it is given; random
    logprobs and certainties; counts its calls. FLOPs: 1 per call, or unknown (None) with
    `flops=None`."""

    capabilities = frozenset({caps.TOKEN_IDS, caps.LOGPROBS, caps.FULL_DISTRIBUTIONS})

    def __init__(self, flops: float | None = 1.0):
        self.calls = []
        self.flops = flops

    def generate(self, prompt, params, *, generator=None):
        self.calls.append((prompt, params.n, params.temperature))
        completions = []
        for _ in range(params.n):
            answer = int(torch.randint(0, 3, (1,), generator=generator)) if params.temperature > 0 else 0
            length = int(torch.randint(1, 6, (1,), generator=generator))
            logprobs = (-torch.rand(length, generator=generator)).tolist()
            certainties = torch.rand(length, generator=generator).tolist()
            completions.append(Completion(f"The answer is {answer}", list(range(length)), logprobs,
                                          certainties=certainties, finish_reason="stop"))
        cost = Cost(model_calls=5, prompt_tokens_computed=4, prompt_tokens_reused=4 * (params.n - 1),
                    generated_tokens=sum(len(c.token_ids) for c in completions), flops=self.flops)
        return GenerationResult(completions, [1, 2, 3, 4], cost=cost)


class ConcurrentDiceGenerator(DiceGenerator):
    """`DiceGenerator` that may be called from several threads: it sleeps `delay` seconds per call
    (so calls overlap) and records how many calls ran at once (`peak`)."""

    concurrent = True

    def __init__(self, flops: float | None = 1.0, delay: float = 0.02):
        super().__init__(flops)
        self.delay, self.running, self.peak = delay, 0, 0
        self._lock = threading.Lock()

    def generate(self, prompt, params, *, generator=None):
        with self._lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
        try:
            time.sleep(self.delay)
            with self._lock:
                return super().generate(prompt, params, generator=generator)
        finally:
            with self._lock:
                self.running -= 1
