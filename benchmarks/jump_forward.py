"""Jump-forward on the embedded model: a JSON schema with long fixed keys, decoded with and
without feeding the constraint's forced runs in one forward (`generate(jump_forward=)`).

    .venv/bin/python benchmarks/jump_forward.py                 # T=0 n=1 and T=1 n=4, 3 repeats
    .venv/bin/python benchmarks/jump_forward.py --repeats 1     # quick check that it runs

Prints per setting: generated tokens, tokens taken from forced runs, model forwards, decode
seconds (median over repeats, on and off interleaved so machine load hits both alike) and the
speed-up. At T=0 the two runs must produce the same tokens (checked). The output law is the same
either way (runs are verified by the same draw as plain decoding, see decoding/sample_loop.py).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from metagen.decoding import generate
from metagen.models import load
from metagen.sampling import SamplingParams

KEYS = ("customer_full_legal_name", "order_has_already_been_paid_in_full", "number_of_items_in_the_order",
        "preferred_delivery_time_window_is_morning")
SCHEMA = {
    "type": "object",
    "properties": {KEYS[0]: {"type": "string", "maxLength": 12}, KEYS[1]: {"type": "boolean"},
                   KEYS[2]: {"type": "integer", "minimum": 1, "maximum": 99}, KEYS[3]: {"type": "boolean"}},
    "required": list(KEYS), "additionalProperties": False,
}
PROMPT = "Give one customer order as JSON."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=96)
    args = parser.parse_args()
    model = load()
    print(f"{'setting':<12}{'tokens':>8}{'forced':>8}{'forwards on/off':>17}{'decode s on':>13}{'off':>8}{'speed-up':>10}")
    for temperature, n in ((0.0, 1), (1.0, 4)):
        params = SamplingParams(temperature=temperature, n=n, seed=0, max_tokens=args.max_tokens,
                                structured_outputs={"json": SCHEMA})
        times = {True: [], False: []}
        runs = {}
        for _ in range(args.repeats):
            for jump in (True, False):
                start = time.perf_counter()
                runs[jump] = generate(model, PROMPT, params, jump_forward=jump)
                times[jump].append(time.perf_counter() - start)
        on, off = runs[True], runs[False]
        if temperature == 0:
            assert [c.token_ids for c in on.completions] == [c.token_ids for c in off.completions]
        t_on, t_off = statistics.median(times[True]), statistics.median(times[False])
        print(f"T={temperature:g} n={n:<6}{on.generated_tokens:>8}{on.forced_tokens:>8}"
              f"{on.model_calls:>9}/{off.model_calls:<7}{t_on:>13.2f}{t_off:>8.2f}{t_off / t_on:>9.2f}x")


if __name__ == "__main__":
    torch.set_num_threads(2)
    main()
