"""Cost.flops None means unknown (a remote server without a declared parameter count)."""

from metagen.decoding.cost import Cost


def test_adding_an_unknown_flops_count_gives_unknown():
    known, unknown = Cost(model_calls=1, flops=10.0), Cost(model_calls=2, flops=None)
    assert (known + unknown).flops is None and (unknown + known).flops is None
    assert (known + unknown).model_calls == 3
    total = Cost(flops=5.0)
    total += unknown
    assert total.flops is None and total.model_calls == 2


def test_known_flops_still_add_and_default_to_zero():
    assert Cost().flops == 0.0
    assert (Cost(flops=1.5, scorer_flops=0.5) + Cost(flops=2.0)).to_dict()["flops"] == 3.5
    assert (Cost(scorer_flops=None) + Cost(scorer_flops=1.0)).scorer_flops is None
