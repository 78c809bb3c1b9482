"""`metagen task arithmetic`: write a built-in task as JSONL on stdout.

One line per problem, {"id", "question", "answer"}: the format `metagen eval --data` reads, so a
task can be saved, edited and evaluated.
"""

from __future__ import annotations

import argparse
import json


def add_parser(commands) -> None:
    task = commands.add_parser("task", help="write a built-in task as JSONL")
    task.add_argument("name", choices=["arithmetic"], help="the built-in task")
    task.add_argument("--count", type=int, default=100, help="number of problems (default 100)")
    task.add_argument("--seed", type=int, default=0, help="problem seed (default 0)")
    task.add_argument("--max-number", type=int, default=9, help="largest operand (default 9)")
    task.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from metagen.eval import arithmetic_problems

    for problem in arithmetic_problems(args.count, args.seed, args.max_number):
        print(json.dumps({"id": problem.id, "question": problem.question, "answer": problem.answer}))
    return 0
