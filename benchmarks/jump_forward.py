"""Jump-forward on the embedded model: a JSON schema with long fixed keys, decoded with and
without feeding the constraint's forced runs in one forward (`generate(jump_forward=)`).

    .venv/bin/python benchmarks/jump_forward.py                 # T=0 n=1 and T=1 n=4, 3 repeats
    .venv/bin/python benchmarks/jump_forward.py --repeats 1     # quick check that it runs

Prints per setting: generated tokens, tokens taken from forced runs, model forwards, decode
seconds (median over repeats, on and off interleaved so machine load hits both alike) and the
speed-up. At T=0 the two runs must produce the same tokens (checked). The output law is the same
either way (runs are verified by the same draw as plain decoding, see decoding/draw_verify.py).

Measured (embedded SmolLM2-135M, default dtype, 2 cores shared with other jobs: load average
10-12, so absolute seconds are several times an idle machine's; medians of 3, on/off interleaved):

    setting       tokens  forced  forwards on/off  decode s on     off  speed-up
    T=0 n=1           88      45       43/88             69.05   89.56     1.30x
    T=1 n=4          316     179       44/96            105.60  121.12     1.15x

Half the tokens come from forced runs and the forwards halve, but under this load a forward is
compute-bound (a profile of the T=1 run: ~83% of decode time in the model, ~17% in the per-token
chain, records and draws), so a run's tokens still cost their matmuls; the saving is the per-forward
fixed cost (weights read, kernel dispatch), larger on an idle machine.
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
              f"{on.cost.model_calls:>9}/{off.cost.model_calls:<7}{t_on:>13.2f}{t_off:>8.2f}{t_off / t_on:>9.2f}x")


if __name__ == "__main__":
    torch.set_num_threads(2)
    main()
