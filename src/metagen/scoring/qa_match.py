"""Short-answer question answering scores: normalized exact match and token F1, as SQuAD
(Rajpurkar et al. 2016) and HotpotQA (Yang et al. 2018) compute them.

    normalize_answer("The Eiffel Tower!")   # "eiffel tower"
    exact_match("the Nile", "Nile")         # True
    token_f1("Addis Ababa city", "Addis Ababa")   # 0.8

Normalization: lower-case, every punctuation character removed, the articles a / an / the
dropped as words, whitespace collapsed. Token F1 over the normalized answers' words w(p), w(g),
counted as multisets:

    common = |w(p) ∩ w(g)|,  precision = common / |w(p)|,  recall = common / |w(g)|,
    F1 = 2 · precision · recall / (precision + recall)   (0 when common = 0)

As HotpotQA's evaluation does, "yes", "no" and "noanswer" score F1 only on an exact match (a
yes/no answer has one token, so a partial overlap would be meaningless). O(length) each.
"""

from __future__ import annotations

import re
import string
from collections import Counter

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)
_SPECIAL = ("yes", "no", "noanswer")


def normalize_answer(text: str) -> str:
    """Lower-cased, punctuation removed, articles dropped, whitespace collapsed."""
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCTUATION)).split())


def exact_match(prediction: str | None, gold: str) -> bool:
    """Whether the normalized prediction equals the normalized gold answer (None: no answer)."""
    return prediction is not None and normalize_answer(prediction) == normalize_answer(gold)


def token_f1(prediction: str | None, gold: str) -> float:
    """Token F1 of the normalized answers (see the module); 0.0 for no answer."""
    if prediction is None:
        return 0.0
    predicted, expected = normalize_answer(prediction), normalize_answer(gold)
    if (predicted in _SPECIAL or expected in _SPECIAL) and predicted != expected:
        return 0.0
    common = sum((Counter(predicted.split()) & Counter(expected.split())).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted.split()), common / len(expected.split())
    return 2 * precision * recall / (precision + recall)
