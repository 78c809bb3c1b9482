"""The engine's draft / verify stage (serve/speculation.py) on the enumerable toy model: greedy
output equals the plain engine's token for token (requests of different lengths joining and
leaving, n > 1, a stop string inside an accepted draft), sampled sequences follow plain decoding's
law (chi-square over whole sequences, through the engine's API), every pushed token is its own
event, and what the server cannot run is refused by name."""

from __future__ import annotations


import pytest

from metagen.sampling import SamplingParams
from metagen.serve.engine import DoneEvent, Engine, ServeRequest, TokenEvent
from metagen.speculative import NgramDrafter, SpeculativeConfig
from metagen.speculative.registry import DRAFTERS, DrafterOptions, check_speculative

from tests.decoding.helpers import assert_follows
from tests.decoding.toy_model import BOS, A, C, ToyModel
from tests.speculative.test_loop import chain_distribution
from tests.serve.events import Collector

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = [BOS, A, C, A, C, A]  # a repeating prompt: prompt lookup drafts "c a c a ..."


def _serve(engine: Engine, cases: list[tuple[list[int], SamplingParams]]) -> list[tuple[ServeRequest, Collector]]:
    """Submit every case at once (they join the batch together and leave at their own lengths)
    and wait for all of them."""
    submitted = []
    for prompt, params in cases:
        collector = Collector()
        request = ServeRequest(list(prompt), params, collector)
        engine.submit(request)
        submitted.append((request, collector))
    for _, collector in submitted:
        assert collector.done.wait(60)
        assert collector.events[-1] == DoneEvent()
    return submitted


def _run(cases, drafter=None, config=None, max_rows=8, model=None):
    """Serve `cases` on an engine over `model` (default the toy chain) drafting with `drafter`
    (none: plain decoding, `config` unused); returns (request, collector) per case, and the engine."""
    engine = Engine(model or ToyModel(max_context=256), max_rows=max_rows, max_queue=len(cases), drafter=drafter,
                    speculative=config if drafter is not None else None)
    engine.start()
    try:
        return _serve(engine, cases), engine
    finally:
        engine.stop()


GREEDY_CASES = [
    (PROMPT, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)),
    (PROMPT[:4], SamplingParams(temperature=0, max_tokens=17, ignore_eos=True, n=2)),
    ([BOS, C, C], SamplingParams(temperature=0, max_tokens=9, ignore_eos=True)),
    ([BOS, A], SamplingParams(temperature=0, max_tokens=30)),
    (PROMPT, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, n=3, logprobs=2)),
]


@pytest.mark.parametrize("verify", ["token", "block", "draw"])
def test_greedy_output_equals_the_plain_engine_token_for_token(verify):
    plain, _ = _run(GREEDY_CASES)
    drafted, engine = _run(GREEDY_CASES, NgramDrafter(max_ngram=2), SpeculativeConfig(num_draft_tokens=3,
                                                                                       verify=verify))
    for (mine, events), (theirs, _) in zip(drafted, plain):
        assert [c.token_ids for c in mine.completions] == [c.token_ids for c in theirs.completions]
        assert [c.finish_reason for c in mine.completions] == [c.finish_reason for c in theirs.completions]
        for ours, reference in zip(mine.completions, theirs.completions):
            assert ours.logprobs == pytest.approx(reference.logprobs, abs=1e-6)
            assert ours.top_logprobs == reference.top_logprobs  # the toy's logits do not depend on the batch
        # one TokenEvent per token, in order, spelling the completion; the finish on the last
        for index, completion in enumerate(mine.completions):
            tokens = events.tokens_of(index)
            assert [e.token_id for e in tokens] == completion.token_ids
            assert "".join(e.text for e in tokens) == completion.text
            assert [e.finish_reason for e in tokens] == [None] * (len(tokens) - 1) + [completion.finish_reason]
            assert [e.record.logprob for e in tokens] == completion.logprobs
    stats = engine.stats
    assert stats.accepted_tokens > 0 and stats.draft_tokens >= stats.accepted_tokens
    generated = sum(len(c.token_ids) for request, _ in drafted for c in request.completions)
    assert stats.generated_tokens == generated
    assert stats.steps < sum(params.max_tokens for _, params in GREEDY_CASES)  # several tokens per step
    assert stats.batch_rows == stats.running_requests == 0


def test_a_stop_string_inside_an_accepted_draft_ends_the_row_there():
    cases = [([BOS, C, C], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, stop=["ccccc"])),
             (PROMPT, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))]
    plain, _ = _run(cases)
    drafted, engine = _run(cases, NgramDrafter(max_ngram=2), SpeculativeConfig(num_draft_tokens=6))
    stopped, reference = drafted[0][0].completions[0], plain[0][0].completions[0]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == "ccccc" and stopped.text == ""
    assert stopped.token_ids == reference.token_ids and stopped.text == reference.text
    assert drafted[1][0].completions[0].token_ids == plain[1][0].completions[0].token_ids
    assert engine.stats.accepted_tokens >= 3  # the stop string was reached through accepted drafts


@pytest.mark.parametrize("verify", ["token", "draw"])
def test_sampled_sequences_follow_plain_decodings_law(verify):
    params = SamplingParams(n=8, max_tokens=4, temperature=1.0)
    cases = [(PROMPT[:4], SamplingParams(n=8, max_tokens=4, temperature=1.0, seed=seed)) for seed in range(250)]
    drafted, engine = _run(cases, NgramDrafter(max_ngram=2), SpeculativeConfig(num_draft_tokens=3, verify=verify),
                           max_rows=64)
    samples = [tuple(c.token_ids) for request, _ in drafted for c in request.completions]
    assert_follows(samples, chain_distribution(params, PROMPT[:4], 4))
    assert engine.stats.accepted_tokens > 0


def test_every_registered_drafter_is_accepted_for_the_server():
    for name in DRAFTERS:
        argument = {"model": ":draft.gguf", "medusa": ":heads.safetensors", "pearl": ":early-exit"}.get(name, "")
        check_speculative(name + argument)
    with pytest.raises(ValueError, match="verify='token' cannot verify"):
        check_speculative("recycling", DrafterOptions(), "token")


def test_mirostat_under_the_rules_and_a_combiner_are_refused():
    engine = Engine(ToyModel(), drafter=NgramDrafter())
    with pytest.raises(ValueError, match="mirostat_tau"):
        engine.submit(ServeRequest(PROMPT, SamplingParams(mirostat_tau=3.0), lambda event: None))
    from metagen.decoding.combine import ContrastiveConfig

    with pytest.raises(ValueError, match="cannot decode with a combiner"):
        Engine(ToyModel(), drafter=NgramDrafter(), combiner=ContrastiveConfig(amateur=ToyModel()), cache_memory=0)
    with pytest.raises(ValueError, match="give drafter= too"):
        Engine(ToyModel(), speculative=SpeculativeConfig())


def test_mirostat_is_served_with_draw_verification():
    cases = [(PROMPT, SamplingParams(mirostat_tau=3.0, seed=4, max_tokens=8))]
    plain, _ = _run(cases)
    drafted, _ = _run(cases, NgramDrafter(max_ngram=2), SpeculativeConfig(verify="draw"))
    assert drafted[0][0].completions[0].token_ids == plain[0][0].completions[0].token_ids  # one seeded row


def test_a_request_cancelled_mid_decode_leaves_and_the_others_go_on():
    engine = Engine(ToyModel(max_context=256), max_rows=8, drafter=NgramDrafter(max_ngram=2),
                    speculative=SpeculativeConfig(num_draft_tokens=4))
    engine.start()
    try:
        cancelled = Collector()
        long = ServeRequest(PROMPT, SamplingParams(temperature=0, max_tokens=200, ignore_eos=True, n=2), cancelled)

        def cancel_after_a_few(event) -> None:  # on the engine thread: it leaves at the next step boundary
            cancelled(event)
            if sum(isinstance(e, TokenEvent) for e in cancelled.events) == 6:
                long.cancel()

        long.emit = cancel_after_a_few
        engine.submit(long)
        other = _serve(engine, [GREEDY_CASES[1]])[0][0]
        assert cancelled.done.wait(60)
    finally:
        engine.stop()
    assert cancelled.events[-1] == DoneEvent("cancelled")
    assert all(len(c.token_ids) < 200 for c in long.completions)
    plain, _ = _run([GREEDY_CASES[1]])
    assert [c.token_ids for c in other.completions] == [c.token_ids for c in plain[0][0].completions]
    assert engine.stats.requests_cancelled == 1 and engine._cache.batch_size == 0  # its rows left the cache


class FailingOnce(ToyModel):
    """The toy model whose first verification forward (logits at every position) raises."""

    failed = False

    def forward(self, cache, tokens, *, logits="last", hidden=False):
        if logits == "all" and not self.failed:
            self.failed = True
            raise RuntimeError("the forward broke")
        return super().forward(cache, tokens, logits=logits, hidden=hidden)


def test_a_failed_verification_forward_fails_the_batch_and_the_engine_goes_on():
    engine = Engine(FailingOnce(max_context=256), max_rows=8, drafter=NgramDrafter(max_ngram=2))
    engine.start()
    try:
        lost = Collector()
        engine.submit(ServeRequest(PROMPT, SamplingParams(temperature=0, max_tokens=10, n=2), lost))
        assert lost.done.wait(60)
        assert lost.events[-1] == DoneEvent("RuntimeError: the forward broke")
        after = _serve(engine, [GREEDY_CASES[0]])[0][0]
    finally:
        engine.stop()
    plain, _ = _run([GREEDY_CASES[0]])
    assert after.completions[0].token_ids == plain[0][0].completions[0].token_ids
    assert engine.stats.requests_failed == 1 and engine._cache.batch_size == 0


@pytest.mark.parametrize("name, options", [("ngram", {"tree_widths": (2, 2, 1)}), ("recycling", {}), ("stand", {}),
                                           ("rasd", {"draft_corpus": "corpus"})])
def test_tree_drafters_in_the_batch_give_plain_greedy_and_plain_decodings_law(name, options, tmp_path):
    """Every served drafter drafts token trees here, verified by the multi-draft rule in the one
    ragged forward (tree attention per row): greedy equals the plain engine's, sampled sequences
    follow plain decoding's law."""
    from metagen.speculative import make_drafter
    from tests.speculative.test_tree import TreeToyModel

    if "draft_corpus" in options:
        (tmp_path / "corpus.txt").write_text("acacacac\n\nbcbcbc\n\ncacaca", encoding="utf-8")
        options = {"draft_corpus": str(tmp_path / "corpus.txt")}
    config = SpeculativeConfig(num_draft_tokens=3, verify="multi-draft")

    def serve(cases, drafter=None):
        served, engine = _run(cases, drafter, config, max_rows=64, model=TreeToyModel(max_context=256))
        return [request for request, _ in served], engine

    drafter = make_drafter(name, TreeToyModel(), **options)
    drafted, engine = serve(GREEDY_CASES, drafter)
    plain, _ = serve(GREEDY_CASES)
    for mine, theirs in zip(drafted, plain):
        assert [c.token_ids for c in mine.completions] == [c.token_ids for c in theirs.completions]
    assert engine.stats.draft_tokens > 0
    params = SamplingParams(n=8, max_tokens=4, temperature=1.0)
    cases = [(PROMPT[:4], SamplingParams(n=8, max_tokens=4, temperature=1.0, seed=seed)) for seed in range(150)]
    sampled, engine = serve(cases, make_drafter(name, TreeToyModel(), **options))
    assert_follows([tuple(c.token_ids) for request in sampled for c in request.completions],
                   chain_distribution(params, PROMPT[:4], 4))
    assert engine.stats.accepted_tokens > 0


def _draft_model_drafters():
    from metagen.speculative import ModelDrafter
    from metagen.speculative.dyspec import DySpecDrafter
    from metagen.speculative.pearl import PearlDrafter
    from metagen.speculative.rasd import SEPARATOR, RasdDrafter
    from metagen.speculative.s2d import S2DDrafter
    from metagen.speculative.tree_drafter import TreeDrafter
    from tests.speculative.test_loop import DraftToyModel
    from tests.speculative.test_s2d import FlatToyModel
    from tests.speculative.test_tree import DraftTreeToyModel

    def rasd_tree():
        tree = TreeDrafter(DraftTreeToyModel(), widths=(2, 1), max_nodes=4)
        return RasdDrafter([A, C, A, C, A, SEPARATOR], model=tree, max_nodes=8)

    return {
        # S2D: two sub-models, each request's copy with caches of its own for both
        "s2d": (lambda: S2DDrafter([FlatToyModel(), DraftToyModel()], threshold=0.4), "token", False),
        # PEARL: the server's copies draft serially (no worker thread), under PEARL's own rule
        "pearl": (lambda: PearlDrafter(DraftToyModel(), parallel=True), "pearl", False),
        "rasd fused with a model tree": (rasd_tree, "multi-draft", True),
        "model, token": (lambda: ModelDrafter(DraftToyModel()), "token", False),
        "model, block": (lambda: ModelDrafter(DraftToyModel()), "block", False),
        "model sharing the prompt cache": (lambda: ModelDrafter(DraftToyModel(), share_prompt_cache=True), "token",
                                           False),
        "tree": (lambda: TreeDrafter(DraftTreeToyModel(), widths=(2, 2, 1), max_nodes=8), "multi-draft", True),
        "dyspec": (lambda: DySpecDrafter(DraftTreeToyModel(), max_nodes=6), "multi-draft", True),
    }


@pytest.mark.parametrize("kind", list(_draft_model_drafters()))
def test_draft_models_in_the_batch_give_plain_greedy_and_plain_decodings_law(kind):
    """A drafter running a model of its own: each request's copy keeps its own draft cache of
    the request's rows (prefilled at its start, following the rows that stay, rolled back after
    rejections) while requests join and leave the batch; the draft disagrees with the target
    (halved, shifted logits), so rejections happen. Greedy equals the plain engine's token for
    token, sampled sequences follow plain decoding's law, and the draft model's cache counts in
    the admission check."""
    from tests.speculative.test_tree import TreeToyModel

    make, verify, trees = _draft_model_drafters()[kind]
    config = SpeculativeConfig(num_draft_tokens=3, verify=verify)

    def serve(cases, drafter=None, max_rows=64):
        target = TreeToyModel(max_context=256) if trees else ToyModel(max_context=256)
        served, engine = _run(cases, drafter, config, max_rows=max_rows, model=target)
        return [request for request, _ in served], engine

    drafter = make()
    assert drafter.draft_models  # its cache joins the admission check (the test below)
    drafted, engine = serve(GREEDY_CASES, drafter, max_rows=8)
    plain, _ = serve(GREEDY_CASES)
    for mine, theirs in zip(drafted, plain):
        assert [c.token_ids for c in mine.completions] == [c.token_ids for c in theirs.completions]
    assert engine.stats.draft_tokens > engine.stats.accepted_tokens > 0  # some drafts rejected, some taken
    params = SamplingParams(n=8, max_tokens=4, temperature=1.0)
    cases = [(PROMPT[:4], SamplingParams(n=8, max_tokens=4, temperature=1.0, seed=seed)) for seed in range(150)]
    sampled, engine = serve(cases, make())
    assert_follows([tuple(c.token_ids) for request in sampled for c in request.completions],
                   chain_distribution(params, PROMPT[:4], 4))
    assert engine.stats.accepted_tokens > 0


def test_medusa_heads_in_the_batch_read_each_rows_hidden_state_from_the_one_forward():
    """Medusa heads draft from the hidden states the engine's forward returns beside the logits
    (each request's copy keeps its rows' states): greedy equals the plain engine's token for
    token, sampled sequences follow plain decoding's law."""
    from metagen.speculative.medusa import MedusaDrafter
    from tests.speculative.test_medusa import HiddenTreeToyModel, random_heads

    config = SpeculativeConfig(num_draft_tokens=3, verify="multi-draft")

    def serve(cases, drafter=None):
        served, engine = _run(cases, drafter, config, max_rows=64, model=HiddenTreeToyModel(max_context=256))
        return [request for request, _ in served], engine

    drafted, engine = serve(GREEDY_CASES, MedusaDrafter(HiddenTreeToyModel(), random_heads(), widths=(2, 2, 1)))
    plain, _ = serve(GREEDY_CASES)
    for mine, theirs in zip(drafted, plain):
        assert [c.token_ids for c in mine.completions] == [c.token_ids for c in theirs.completions]
    assert engine.stats.draft_tokens > engine.stats.accepted_tokens > 0
    params = SamplingParams(n=8, max_tokens=4, temperature=1.0)
    cases = [(PROMPT[:4], SamplingParams(n=8, max_tokens=4, temperature=1.0, seed=seed)) for seed in range(150)]
    sampled, engine = serve(cases, MedusaDrafter(HiddenTreeToyModel(), random_heads(), widths=(2, 2, 1)))
    assert_follows([tuple(c.token_ids) for request in sampled for c in request.completions],
                   chain_distribution(params, PROMPT[:4], 4))
    assert engine.stats.accepted_tokens > 0


def test_a_draft_models_cache_counts_in_the_admission_check(monkeypatch):
    """Rows that fit beside the target's cache alone are refused once the draft model's cache is
    counted too (the same check, `check_batch_fits`, over both models)."""
    from metagen.decoding import memory
    from metagen.speculative import ModelDrafter
    from tests.speculative.test_loop import DraftToyModel

    target, draft = ToyModel(max_context=256), DraftToyModel(max_context=256)
    params = SamplingParams(max_tokens=100, n=4)
    logits = (memory.LOGIT_COPIES + memory.COMPANION_LOGIT_COPIES) * 4 * target.vocab_size * 4
    need_both = 4 * (logits + 100 * (target.kv_bytes_per_token + draft.kv_bytes_per_token))
    monkeypatch.setattr(memory, "available_memory", lambda: need_both - 1)
    plain = Engine(target, max_rows=8)
    plain.start()
    try:
        [(request, events)] = _serve(plain, [(PROMPT, params)])
        assert events.events[-1] == DoneEvent()
    finally:
        plain.stop()
    engine = Engine(target, max_rows=8, drafter=ModelDrafter(draft), speculative=SpeculativeConfig(num_draft_tokens=3))
    engine.start()
    try:
        refused = Collector()
        engine.submit(ServeRequest(PROMPT, params, refused))
        assert refused.done.wait(60)
    finally:
        engine.stop()
    error = refused.events[-1].error
    assert error.startswith("ValueError: n=4 is too large for this machine") and "in the caches of models" in error
    assert refused.tokens == []
