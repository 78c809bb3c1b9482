"""Token trees through the speculative loop: a static tree from a draft model, verified in one
target forward per step. On the enumerable toy model the emitted sequences follow plain
sampling's law (chi-square over whole sequences), greedy equals plain greedy with stops and
stateful processors, and each step is one target forward over t0 and the tree's nodes."""

from __future__ import annotations

import pytest
import torch

from metagen.decoding import generate
from metagen.decoding.drafts import Draft
from metagen.models.base import ForwardOutput
from metagen.sampling import SamplingParams
from metagen.speculative import ModelDrafter, NgramDrafter, SpeculativeConfig, speculative_generate
from metagen.speculative.tree_drafter import TreeDrafter
from metagen.speculative.tree_verify import TreeVerification

from tests.decoding.helpers import assert_follows
from tests.decoding.toy_model import BOS, C, VOCAB, A, ToyCache, ToyModel, next_logits
from tests.speculative.test_loop import DRAFT_SHIFT, PROMPT, DraftToyModel, chain_distribution

pytestmark = pytest.mark.usefixtures("one_thread")

TREE = SpeculativeConfig(num_draft_tokens=3, verify="multi-draft")


class TreeToyCache(ToyCache):
    """Token-list rows with `keep_path`: the fed tokens after `start` become the kept ones."""

    def keep_path(self, row: int, start: int, kept) -> None:
        fed = self.rows[row][start:]
        self.rows[row][start:] = [fed[i] for i in kept]


class TreeToyModel(ToyModel):
    """The toy chain, running token trees: node i's logits follow the cached row and its
    root-to-node path only (what tree attention gives); all fed tokens are cached in fed order."""

    name = "toy-tree"
    shift: torch.Tensor | None = None

    def new_cache(self, batch_size: int = 1) -> TreeToyCache:
        return TreeToyCache(batch_size)

    def forward(self, cache, tokens, *, logits="last", hidden=False, tree=None) -> ForwardOutput:
        if tree is None:
            out = super().forward(cache, tokens, logits=logits, hidden=hidden)
            return out if out.logits is None or self.shift is None else ForwardOutput(
                out.logits * 0.5 + self.shift, None, out.num_new)
        per_row = []
        for b, (cached, new) in enumerate(zip(cache.rows, tokens)):
            parents = tree[b] if tree[b] is not None else list(range(-1, len(new) - 1))
            steps = []
            for i in range(len(new)):
                path, node = [], i
                while node != -1:
                    path.append(new[node])
                    node = parents[node]
                steps.append(next_logits(cached + path[::-1]))
            cached.extend(new)
            per_row.append(torch.stack(steps))
        self.calls.append([len(new) for new in tokens])
        padded = torch.zeros(len(per_row), max(len(s) for s in per_row), VOCAB)
        for b, steps in enumerate(per_row):
            padded[b, : len(steps)] = steps
        if self.shift is not None:
            padded = padded * 0.5 + self.shift
        assert logits == "all"
        return ForwardOutput(padded, None, [len(new) for new in tokens])


class DraftTreeToyModel(TreeToyModel):
    """`DraftToyModel`'s logits (halved, shifted), with trees."""

    name = "toy-tree-draft"
    shift = DRAFT_SHIFT


def tree_drafter(widths=(2, 2, 1), max_nodes=16, same=False):
    return TreeDrafter(TreeToyModel() if same else DraftTreeToyModel(), widths=widths, max_nodes=max_nodes)


# ------------------------------------------------------------------ the output distribution


@pytest.mark.parametrize("widths", [(2, 2, 1), (3,), (1, 3)])
def test_tree_sequences_follow_the_target_distribution(widths):
    params = SamplingParams(n=3000, max_tokens=4, seed=13)
    result = speculative_generate(TreeToyModel(), tree_drafter(widths), PROMPT, params, TREE)
    assert_follows((tuple(c.token_ids) for c in result.completions), chain_distribution(params, PROMPT, 4))
    assert result.cost.draft_tokens > 0 and 0 < result.cost.accepted_tokens < result.cost.draft_tokens


@pytest.mark.parametrize(
    "fields",
    [{"temperature": 0.7, "top_k": 3}, {"repetition_penalty": 1.6, "presence_penalty": 0.5},
     {"no_repeat_ngram_size": 2, "logit_bias": {3: 1.5}}],
    ids=["temperature-top_k", "penalties", "ngram-ban-bias"],
)
def test_the_chain_follows_each_node_and_the_kept_path(fields):
    """Stateful processors see each node's path while verifying and the kept path afterwards."""
    params = SamplingParams(n=3000, max_tokens=4, seed=4, **fields)
    result = speculative_generate(TreeToyModel(), tree_drafter(), PROMPT, params, TREE)
    assert_follows((tuple(c.token_ids) for c in result.completions), chain_distribution(params, PROMPT, 4))


def test_a_custom_stateful_processor_is_left_on_the_kept_path():
    from tests.decoding.ban_repeats import BanRepeats, distribution_without_repeats

    processor = BanRepeats()
    params = SamplingParams(n=3000, max_tokens=4, seed=6)
    result = speculative_generate(TreeToyModel(), tree_drafter(), PROMPT, params, TREE, processors=[processor])
    assert_follows((tuple(c.token_ids) for c in result.completions), distribution_without_repeats(PROMPT, 4))


@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_the_tree_rule_on_chain_drafts_follows_the_target(drafter):
    """Chains are one-child trees: sampled drafts (p from the model) and point masses (n-gram:
    each candidate accepted with prob r(x), then removed from r)."""
    params = SamplingParams(n=3000, max_tokens=4, seed=2)
    chain_drafter = ModelDrafter(DraftToyModel()) if drafter == "model" else NgramDrafter(max_ngram=2)
    result = speculative_generate(ToyModel(), chain_drafter, PROMPT, params, TREE)
    assert_follows((tuple(c.token_ids) for c in result.completions), chain_distribution(params, PROMPT, 4))
    assert 0 < result.cost.accepted_tokens < result.cost.draft_tokens


# ------------------------------------------------------------------------- greedy and stops


@pytest.mark.parametrize(
    "fields",
    [{}, {"repetition_penalty": 1.3}, {"stop": ["ca"]}, {"ignore_eos": True}, {"stop_token_ids": [A]}],
    ids=["plain", "penalty", "stop-string", "ignore-eos", "stop-token"],
)
@pytest.mark.parametrize("prompt", [[BOS], PROMPT, [BOS, C, A, C, A, C]])
def test_tree_greedy_equals_plain_greedy(fields, prompt):
    params = SamplingParams(temperature=0, max_tokens=7, **fields)
    plain = generate(ToyModel(), prompt, params).completions[0]
    spec = speculative_generate(TreeToyModel(), tree_drafter(), prompt, params, TREE).completions[0]
    assert spec.token_ids == plain.token_ids
    assert (spec.text, spec.finish_reason, spec.stop_reason) == (plain.text, plain.finish_reason, plain.stop_reason)
    assert spec.logprobs == pytest.approx(plain.logprobs, abs=1e-5)


def test_greedy_tree_rule_takes_the_argmax_path_among_siblings():
    """Hand-made tree after BOS: roots b, a (the argmax "a" second), a's children c, b; the rule
    walks to the matching sibling, then stops where no child is the argmax."""
    from metagen.decoding.batch import RowBatch
    from metagen.decoding.result import GenerationResult

    model = TreeToyModel()
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    batch = RowBatch.for_prompt(model, [BOS], params, (), chat=False, generator=None, positions=8)
    batch.fill(GenerationResult([], batch.prompt_ids))
    cache, _ = batch.prefill(None)
    a_best = int(next_logits([BOS, A]).argmax())
    tokens = [2, A, 3 if a_best != 3 else 2, a_best]
    draft = Draft([tokens], [[-1, -1, 1, 1]], [None])
    tree = [[-1] + [p + 1 for p in draft.parents[0]]]
    logits = model.forward(cache, [[BOS] + tokens], logits="all", tree=tree).logits
    verify = TreeVerification().verify(batch, logits, draft)
    with pytest.raises(StopIteration) as stop:
        while True:
            next(verify)
    (tau, token, nodes), = stop.value.value
    assert nodes == [1, 3] and tau == 2
    assert token == int(next_logits([BOS, A, a_best]).argmax())


# ------------------------------------------------------------------------------- the cost


def test_one_target_forward_per_step_over_t0_and_the_nodes():
    target, drafter = TreeToyModel(), tree_drafter((2, 2, 1), max_nodes=5)
    params = SamplingParams(n=4, max_tokens=6, seed=1, ignore_eos=True)
    result = speculative_generate(target, drafter, PROMPT, params, TREE)
    cost = result.cost
    steps = target.calls[1:]  # after the prefill: one call per step, all rows in it
    draft_calls = len(drafter.model.calls) - 1  # all but the drafter's prompt prefill
    assert cost.model_calls == 1 + len(steps) + draft_calls
    assert all(1 <= fed - 1 <= 5 for row in steps for fed in row)  # t0 plus at most max_nodes
    assert cost.draft_tokens == sum(fed - 1 for row in steps for fed in row)
    assert cost.target_steps == 4 + sum(len(row) for row in steps)  # prefill's row per completion, then one per row
    assert cost.block_efficiency == pytest.approx(cost.generated_tokens / cost.target_steps)
    assert cost.block_efficiency > 1.0


def test_identical_draft_tree_keeps_the_deepest_path():
    params = SamplingParams(temperature=0, max_tokens=7, ignore_eos=True)
    result = speculative_generate(TreeToyModel(), tree_drafter(same=True), PROMPT, params, TREE)
    # depth 3 kept every step: the prefill's token, then 3 + bonus per forward
    assert result.cost.target_steps == 1 + 2 and len(result.completions[0].token_ids) == 7


def test_a_chain_rule_refuses_the_tree_drafter():
    with pytest.raises(ValueError, match="proposes token trees.*verify='multi-draft'"):
        speculative_generate(TreeToyModel(), tree_drafter(), PROMPT, SamplingParams(max_tokens=3),
                             SpeculativeConfig(verify="token"))


@pytest.mark.parametrize("options, message", [({"widths": ()}, "widths=()"), ({"widths": (2, 0)}, "widths"),
                                              ({"max_nodes": 0}, "max_nodes=0")])
def test_tree_drafter_options_are_checked(options, message):
    with pytest.raises(ValueError, match=message):
        TreeDrafter(DraftTreeToyModel(), **options)


# ------------------------------------------------------------------------- under a constraint


def test_sampled_trees_follow_the_constrained_law():
    """The toy DFA masks draft and target; each node is processed by the constraint advanced
    along its own path, and the constraint ends on the kept path (its stop verdicts included)."""
    from tests.decoding.toy_grammar import ToyGrammar, masked_law

    processor = ToyGrammar()
    params = SamplingParams(n=3000, max_tokens=5, seed=23)
    result = speculative_generate(TreeToyModel(), tree_drafter(), [BOS], params, TREE, processors=[processor])
    assert_follows((tuple(c.token_ids) for c in result.completions), masked_law([BOS], 5))
    assert 0 < result.cost.accepted_tokens < result.cost.draft_tokens
    assert processor.history == [[0]]  # the given processor is never changed


@pytest.mark.parametrize("max_tokens", [2, 5, 9])
def test_greedy_trees_equal_plain_constrained_greedy(max_tokens):
    from tests.decoding.toy_grammar import ToyGrammar

    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    plain = generate(ToyModel(), [BOS], params, processors=[ToyGrammar()]).completions[0]
    spec = speculative_generate(TreeToyModel(), tree_drafter(), [BOS], params, TREE,
                                processors=[ToyGrammar()]).completions[0]
    assert spec.token_ids == plain.token_ids
    assert (spec.finish_reason, spec.complete) == (plain.finish_reason, plain.complete)


def test_the_memory_check_counts_the_tree_s_nodes(monkeypatch):
    """A step scores t0 and up to max_nodes nodes (more than γ): the batch's memory check sees them."""
    import metagen.decoding.batch as batch_module

    seen = []
    monkeypatch.setattr(batch_module, "check_batch_fits", lambda *args, **kwargs: seen.append(args[3]))
    speculative_generate(TreeToyModel(), tree_drafter(max_nodes=9), PROMPT, SamplingParams(max_tokens=3), TREE)
    speculative_generate(ToyModel(), NgramDrafter(), PROMPT, SamplingParams(max_tokens=3), TREE)
    assert seen == [1 + 9, 1 + TREE.num_draft_tokens]
