"""Tools: the calculator's exact values and refusals, the Python tool in the sandbox, and the
errors-as-text contract."""

import pytest

from metagen.tools import Calculator, FunctionTool, PythonTool, Tool, ToolError, evaluate


@pytest.mark.parametrize(
    "expression, expected",
    [
        ("2 ** 10", "1024"),
        ("2 ** 100", "1267650600228229401496703205376"),  # exact, not 1.2676506002282294e+30
        ("7 / 2", "3.5"),
        ("6 / 3", "2"),  # whole results print as integers
        ("0.1 * 3", "0.3"),  # decimals are exact rationals: not 0.30000000000000004
        ("1 / 3", "0.3333333333333333"),
        ("(12 * 7 + 3) / 4", "21.75"),
        ("-7 // 2", "-4"),
        ("-7 % 3", "2"),
        ("+-3", "-3"),
        ("2 ^ 3 ^ 2", "512"),  # ^ is power, right-associative
        ("3 × 4 ÷ 2 − 1", "5"),
        ("12 * 7 =", "84"),
        ("sqrt(16)", "4"),
        ("sqrt(9 / 4)", "1.5"),
        ("sqrt(2)", "1.4142135623730951"),
        ("round(2.675, 2)", "2.68"),  # exact half-even on 2675/1000 (the float 2.675 rounds to 2.67)
        ("round(7 / 2)", "4"),
        ("abs(-2.5) + max(1, 4, 2) - min(3, 5)", "3.5"),
        ("floor(-2.5) + ceil(2.1)", "0"),
        ("factorial(20)", "2432902008176640000"),
        ("gcd(12, 18) * lcm(4, 6)", "72"),
        ("log(8, 2)", "3.0"),
        ("2 * pi", "6.283185307179586"),
        ("4 ** -1", "0.25"),
        ("4 ** 0.5", "2.0"),
    ],
)
def test_calculator_values(expression, expected):
    assert Calculator()(expression) == expected


def test_exact_integers_stay_integers():
    assert evaluate("2 ** 64 - 1") == 18446744073709551615 and isinstance(evaluate("10 / 5"), int)
    assert evaluate("2 ** 13999").bit_length() == 14000


@pytest.mark.parametrize(
    "expression, message",
    [
        ("1 / 0", "error: division by zero"),
        ("5 % 0", "error: division by zero"),
        ("0 ** -1", "error: division by zero"),
        ("__import__('os').system('true')", "error: attribute access is not allowed"),
        ("__import__('os')", "error: function '__import__' is not allowed"),
        ("open('/etc/passwd')", "error: function 'open' is not allowed"),
        ("x + 1", "error: name 'x' is not allowed"),
        ("(1).real", "error: attribute access is not allowed"),
        ("'a' * 3", "error: 'a' is not a number"),
        ("[1, 2]", "error: list is not allowed"),
        ("1 < 2", "error: compare is not allowed"),
        ("lambda: 1", "error: lambda is not allowed"),
        ("round(1, ndigits=2)", "error: round() takes plain positional arguments only"),
        ("2 ** 14000", "error: result too large"),
        ("10 ** 10 ** 10", "error: result too large"),
        ("factorial(5000)", "error: factorial(5000) is too large"),
        ("round(1 / 3, 10 ** 9)", "error: round needs an integer number of digits"),
        ("sqrt(-1)", "error: sqrt of a negative number"),
        ("(-8) ** (1 / 3)", "error: a negative number to a fractional power is not a real number"),
        ("exp(1000)", "error: math range error"),
        ("1e400", "error: number too large"),
        ("2 +", "error: not an arithmetic expression"),
        ("", "error: empty expression"),
        ("1" * 1001, "error: expression longer than 1000 characters"),
        ("-" * 990 + "1", "error: expression nested too deeply"),
    ],
)
def test_calculator_refusals_are_text(expression, message):
    assert Calculator()(expression).startswith(message)


def test_tool_contract_turns_exceptions_into_text():
    def lookup(text):
        """Capital cities."""
        return {"France": "Paris"}[text]

    tool = FunctionTool(lookup)
    assert (tool.name, tool.description, tool("France")) == ("lookup", "Capital cities.", "Paris")
    assert tool("Spain") == "error: 'Spain'"

    class Failing(Tool):
        def run(self, text):
            raise ToolError("no such thing")

    assert Failing()("x") == "error: no such thing"
    with pytest.raises(TypeError):
        Tool()  # abstract
    assert Calculator.name == "calculator" and "sqrt" in Calculator.description


def test_python_tool_runs_code_in_the_sandbox():
    python = PythonTool(timeout=3.0)
    assert python("print(sum(range(10)))") == "45"
    assert python("x = 6\nx * 7") == "42"  # a final expression is printed
    assert python("```python\nimport math\nprint(math.factorial(10))\n```") == "3628800"
    assert python("for i in range(3):\n    print(i)") == "0\n1\n2"
    assert python("x = 1") == "(no output)"
    assert python("print('partial')\n1 / 0") == "partial\nerror: ZeroDivisionError: division by zero"
    assert python("def f(:\n    pass").startswith("error: SyntaxError")
    refused = python("open('/etc/hosts', 'a')")  # read-only (and not its own) outside its directory
    assert refused.startswith(("error: OSError", "error: PermissionError")) and "/etc/hosts" in refused
    assert python("while True:\n    pass") == "error: timeout (wall-clock limit of 3 s reached)"
    assert python("print('x' * 5000)").endswith("(3000 more characters)")
    assert python("   ") == "error: no code to run"
