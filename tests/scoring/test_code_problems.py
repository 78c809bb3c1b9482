"""build_program: the program a completion-style or chat-style reply makes of a code problem."""

from metagen.scoring.code_problems import build_program, code_in_prompt, entry_point_of

PROMPT = '''from typing import List


def helper(x):
    return x + 1


def add_one(values: List[int]) -> List[int]:
    """ Add one to each value.
    >>> add_one([1, 2])
    [2, 3]
    """
'''


def run(program: str, call: str):
    scope: dict = {}
    exec(compile(program, "<program>", "exec"), scope)  # the test's own source, not a model's
    return eval(call, scope)


def test_entry_point_is_the_last_top_level_function():
    assert entry_point_of(PROMPT) == "add_one"
    assert entry_point_of("x = 1\n") is None


def test_completion_style_reply_continues_the_prompt():
    program = build_program(PROMPT, "    return [helper(v) for v in values]\n")
    assert program.startswith(PROMPT)
    assert run(program, "add_one([1, 2])") == [2, 3]


def test_chat_reply_redefines_the_function_and_keeps_the_prompts_imports_and_helpers():
    reply = "Here it is:\n```python\ndef add_one(values: List[int]) -> List[int]:\n    return [helper(v) for v in values]\n```\nDone."
    program = build_program(PROMPT, reply)
    assert "Here it is" not in program and "Done." not in program
    assert run(program, "add_one([5])") == [6]


def test_code_that_cannot_follow_the_prompt_runs_alone():
    # the prompt here ends inside an unclosed string, so prompt + code does not compile
    program = build_program('def f(x):\n    """open', "```python\ndef f(x):\n    return 2 * x\n```")
    assert program == "def f(x):\n    return 2 * x\n"


def test_a_reply_without_code_gives_none():
    assert build_program(PROMPT, "   \n") is None


def test_code_in_prompt_reads_the_fenced_block_of_a_chat_request():
    request = f"Complete this function.\n```python\n{PROMPT}```\nAnswer with code."
    assert code_in_prompt(request) == PROMPT
    assert code_in_prompt(PROMPT) == PROMPT
