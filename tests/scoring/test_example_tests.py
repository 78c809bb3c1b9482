"""ExampleTests: a reply's program scored on the prompt's docstring examples, and keyed by its
outputs on their calls (never their expected values)."""

from metagen.scoring.example_tests import ExampleTests, canonical

PROMPT = '''def double(x):
    """Double x.
    >>> double(1)
    2
    >>> double(3)
    6
    """
'''
NO_EXAMPLES = 'def double(x):\n    """Double x."""\n'


def test_scores_are_the_share_of_examples_passed(no_leftovers):
    tests = ExampleTests(PROMPT)
    assert [e.test() for e in tests.examples] == ["assert (double(1)) == 2", "assert (double(3)) == 6"]
    right, cost = tests.score("    return 2 * x\n")  # completion-style
    assert right == 1.0 and cost.wall_seconds > 0 and cost.flops == 0
    assert tests.score("```python\ndef double(x):\n    return x + 1\n```")[0] == 0.5  # chat-style, 2 = 1 + 1 only
    assert tests.score("    return 1 / 0\n")[0] == 0.0
    assert tests.score("")[0] == 0.0  # no code: passes none of the examples


def test_no_examples_no_score():
    tests = ExampleTests(NO_EXAMPLES)
    assert tests.verifier is None and tests.score("    return 2 * x\n") == (None, tests.score("")[1])
    assert tests.score("    return 2 * x\n")[0] is None


def test_cluster_keys_read_outputs_not_expected_values(no_leftovers):
    tests = ExampleTests(PROMPT)
    key = lambda reply: tests.cluster_key(reply)[0]  # noqa: E731
    doubled, plus_one = key("    return 2 * x\n"), key("    return x + 1\n")
    assert doubled == key("    return x + x  # same outputs\n") and doubled != plus_one
    wrong_alike = key("    return 7\n")
    assert wrong_alike == key("    return 3 + 4\n") != doubled  # equal wrong outputs cluster too
    raised = key("    return 1 // (x - 1)\n")  # ZeroDivisionError on the first example, 0 on the second
    assert raised is not None and raised not in (doubled, plus_one)
    assert key("    return 'a' if x == 1 else 'A'\n") != key("    return 'A' if x == 1 else 'a'\n")  # case kept
    assert key("    return (\n") is None  # does not compile: no cluster
    assert key("    return x\nraise SystemExit\n") is None  # fails while loading
    assert key("") is None


def test_without_examples_the_key_is_the_normalized_program():
    tests = ExampleTests(NO_EXAMPLES)
    one = tests.cluster_key("    return 2 * x  # twice\n")[0]
    assert one == tests.cluster_key("    return (2 * x)\n")[0] != tests.cluster_key("    return x + x\n")[0]


def test_canonical_text_ignores_set_and_dict_order():
    assert canonical({"b", "a"}) == canonical({"a", "b"}) == "set({'a', 'b'})"
    assert canonical({2: [1], 1: (1,)}) == "{1: (1, ), 2: [1]}"
    assert canonical(1) != canonical(1.0) and canonical((1,)) != canonical([1])
