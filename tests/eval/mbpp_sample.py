"""Four records of MBPP's mbpp.jsonl (task ids 2, 11, 17 and 20), copied as data, as they are.

MBPP: Austin et al. 2021, "Program Synthesis with Large Language Models"; the data set is
Copyright Google LLC, released under the Creative Commons Attribution 4.0 licence (CC-BY 4.0,
https://creativecommons.org/licenses/by/4.0/), from google-research/google-research, mbpp/.
Unchanged but for being held as Python strings. Id 2 lies outside the test split (11-510).
"""

LINES = (
    '{"text": "Write a function to find the similar elements from the given two tuple lists.", "code": "def similar_elements(test_tup1, test_tup2):\\r\\n  res = tuple(set(test_tup1) & set(test_tup2))\\r\\n  return (res) ", "task_id": 2, "test_setup_code": "", "test_list": ["assert similar_elements((3, 4, 5, 6),(5, 7, 4, 10)) == (4, 5)", "assert similar_elements((1, 2, 3, 4),(5, 4, 3, 7)) == (3, 4)", "assert similar_elements((11, 12, 14, 13),(17, 15, 14, 13)) == (13, 14)"], "challenge_test_list": []}',
    '{"text": "Write a python function to remove first and last occurrence of a given character from the string.", "code": "def remove_Occ(s,ch): \\r\\n    for i in range(len(s)): \\r\\n        if (s[i] == ch): \\r\\n            s = s[0 : i] + s[i + 1:] \\r\\n            break\\r\\n    for i in range(len(s) - 1,-1,-1):  \\r\\n        if (s[i] == ch): \\r\\n            s = s[0 : i] + s[i + 1:] \\r\\n            break\\r\\n    return s ", "task_id": 11, "test_setup_code": "", "test_list": ["assert remove_Occ(\\"hello\\",\\"l\\") == \\"heo\\"", "assert remove_Occ(\\"abcda\\",\\"a\\") == \\"bcd\\"", "assert remove_Occ(\\"PHP\\",\\"P\\") == \\"H\\""], "challenge_test_list": ["assert remove_Occ(\\"hellolloll\\",\\"l\\") == \\"helollol\\"", "assert remove_Occ(\\"\\",\\"l\\") == \\"\\""]}',
    '{"text": "Write a function to find the perimeter of a square.", "code": "def square_perimeter(a):\\r\\n  perimeter=4*a\\r\\n  return perimeter", "task_id": 17, "test_setup_code": "", "test_list": ["assert square_perimeter(10)==40", "assert square_perimeter(5)==20", "assert square_perimeter(4)==16"], "challenge_test_list": []}',
    '{"text": "Write a function to check if the given number is woodball or not.", "code": "def is_woodall(x): \\r\\n\\tif (x % 2 == 0): \\r\\n\\t\\treturn False\\r\\n\\tif (x == 1): \\r\\n\\t\\treturn True\\r\\n\\tx = x + 1 \\r\\n\\tp = 0\\r\\n\\twhile (x % 2 == 0): \\r\\n\\t\\tx = x/2\\r\\n\\t\\tp = p + 1\\r\\n\\t\\tif (p == x): \\r\\n\\t\\t\\treturn True\\r\\n\\treturn False", "task_id": 20, "test_setup_code": "", "test_list": ["assert is_woodall(383) == True", "assert is_woodall(254) == False", "assert is_woodall(200) == False"], "challenge_test_list": ["assert is_woodall(32212254719) == True", "assert is_woodall(32212254718) == False", "assert is_woodall(159) == True"]}',
)


def write(path) -> None:
    """The records as a JSONL file at `path` (the form of mbpp.jsonl)."""
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("".join(line + "\n" for line in LINES))
