"""Drafters and verification rules by name: the one table `SpeculativeGenerator.by_name`,
`metagen generate --speculative NAME --verify NAME` and the speculative guide read.

    drafter = make_drafter("early-exit", target, exit_layer=12)   # DRAFTERS["early-exit"]
    drafter = make_drafter("model:draft.gguf", target)            # an entry taking an argument
    verification = make_verification("block")                      # VERIFICATIONS["block"]

A `DrafterSpec` names its factory, what it is, which `DrafterOptions` it reads (any other option
given is refused by name) and whether its name takes an argument (`model:PATH`). A
`VerificationSpec` names the loop's `Verification` it builds and whether it verifies token trees
(`trees`: a tree drafter's drafts need such a rule). Each is added by one
`register_drafter(...)` / `register_verification(...)` line below; the order of those lines is
the order the command line and errors list them in.

Trees are an option, not a second table: every drafter reading `tree_widths` / `tree_nodes`
(early-exit, quantized, model:PATH, ngram) drafts a token tree when either is given, and its
chains otherwise. A model drafter then builds a static tree from the same draft model
(`tree_drafter.TreeDrafter`); the n-gram drafter makes its lookups' distinct continuations
siblings (`ngram_tree.NgramTreeDrafter`). `tree` is the early-exit draft with tree options by
default (widths 2, 2, 1). A tree needs a rule with `trees` (multi-draft, the default then):

    make_drafter("quantized", target, tree_widths=(3, 1))         # a tree from the int4 copy
    check_speculative("ngram", DrafterOptions(tree_widths=(2, 2)), "token")   # ValueError

`check_speculative` picks the rule (the given one, else multi-draft for trees, else the entry's
`verify`) and refuses a chain-only rule with tree options, or `confidence` (a chain's stopping
rule) with them, before any model loads.

Nothing heavy is imported here: the factories import their drafter or rule when called, so the
names (and `metagen generate --help`) come without torch, and an unknown name or an option an
entry does not read is refused (`check_drafter`, `check_verification`) before any model loads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from metagen.speculative.drafter_options import DRAFT_DTYPES, DrafterOptions

if TYPE_CHECKING:
    from metagen.decoding.drafts import Drafter, Verification

__all__ = ["DRAFTERS", "DRAFT_DTYPES", "VERIFICATIONS", "DrafterOptions", "DrafterSpec", "VerificationSpec",
           "check_drafter", "check_speculative", "check_verification", "default_exit_layer", "drafter_names", "make_drafter",
           "make_verification", "register_drafter", "register_verification"]

@dataclass(frozen=True)
class DrafterSpec:
    """factory(target, argument, options) -> Drafter; `reads`: the `DrafterOptions` it reads;
    `argument`: what follows `name:` (e.g. "PATH"), None when the name takes none; `verify`:
    the rule the command line uses when none is given (a tree drafter's is a tree rule). Every
    entry also runs in `metagen serve`: the engine gives each request its own copy
    (`Drafter.for_request`), whose draft models, if any, keep their own caches of that request's
    rows (`Drafter.draft_models`)."""

    name: str
    description: str
    factory: Callable[[object, str | None, DrafterOptions], Drafter]
    reads: tuple[str, ...] = ()
    argument: str | None = None
    verify: str = "token"

    @property
    def spelling(self) -> str:
        """The name as typed: `ngram`, or `model:PATH` for an entry taking an argument."""
        return self.name if self.argument is None else f"{self.name}:{self.argument}"


@dataclass(frozen=True)
class VerificationSpec:
    """factory() -> the loop's `Verification`; `trees`: it verifies tree drafts (and chains),
    otherwise chains only; `iid_siblings`: the trees' siblings must be drawn i.i.d. (with
    replacement, `Drafter.iid_siblings`), as SpecTr's k drafts are."""

    name: str
    description: str
    factory: Callable[[], Verification]
    trees: bool = False
    iid_siblings: bool = False


DRAFTERS: dict[str, DrafterSpec] = {}
VERIFICATIONS: dict[str, VerificationSpec] = {}


def register_drafter(spec: DrafterSpec) -> DrafterSpec:
    """Add `spec` to `DRAFTERS`; ValueError for a name taken or an option `DrafterOptions` lacks."""
    if spec.name in DRAFTERS or ":" in spec.name:
        raise ValueError(f"drafter name {spec.name!r} is taken or has a ':'")
    unknown = set(spec.reads) - {field.name for field in fields(DrafterOptions)}
    if unknown:
        raise ValueError(f"drafter {spec.name!r} reads options DrafterOptions lacks: {sorted(unknown)}")
    DRAFTERS[spec.name] = spec
    return spec


def register_verification(spec: VerificationSpec) -> VerificationSpec:
    """Add `spec` to `VERIFICATIONS`; ValueError for a name taken or an entry without factory."""
    if spec.name in VERIFICATIONS:
        raise ValueError(f"verification rule {spec.name!r} is registered twice")
    if not callable(spec.factory):
        raise ValueError(f"verification rule {spec.name!r} has factory={spec.factory!r}: give a callable")
    VERIFICATIONS[spec.name] = spec
    return spec


def drafter_names() -> list[str]:
    """The drafters as typed (`model:PATH` for one taking an argument), in registration order."""
    return [spec.spelling for spec in DRAFTERS.values()]


def check_drafter(name: str, options: DrafterOptions | None = None) -> tuple[DrafterSpec, str | None]:
    """(entry, argument) of drafter `name` ("ngram", "model:PATH"); ValueError naming the known
    drafters for an unknown name, and naming the option for one the entry does not read. Loads
    nothing."""
    base, colon, argument = name.partition(":")
    spec = DRAFTERS.get(base)
    if spec is None or bool(colon) != (spec.argument is not None) or (colon and not argument):
        raise ValueError(f"speculative drafter {name!r} is unknown: choose one of {', '.join(drafter_names())}")
    for option, value in (options or DrafterOptions()).given().items():
        if option not in spec.reads:
            reads = ", ".join(spec.reads) or "none"
            raise ValueError(f"{option}={value!r} does not apply to the {spec.name} drafter (it reads: {reads})")
    return spec, argument if colon else None


def check_speculative(name: str, options: DrafterOptions | None = None, verify: str | None = None
                      ) -> tuple[DrafterSpec, str]:
    """(entry, rule) of drafter `name` with `options`, verified by `verify` (None: multi-draft
    when the drafts are trees, else the entry's `verify`). ValueError, before any model loads,
    for what `check_drafter` / `check_verification` refuse, a chain-only rule with tree drafts
    and `confidence` (which ends a chain early) with tree options."""
    options = options or DrafterOptions()
    spec, _ = check_drafter(name, options)
    trees = options.tree or check_verification(spec.verify).trees
    if verify is None:
        verify = "multi-draft" if trees and not check_verification(spec.verify).trees else spec.verify
    if trees and not check_verification(verify).trees:
        given = ", ".join(f"{option}={value!r}" for option, value in options.given().items() if option in _TREE_OPTIONS)
        tree_rules = ", ".join(rule for rule, entry in VERIFICATIONS.items() if entry.trees)
        raise ValueError(f"the {name} drafter{' with ' + given if given else ''} proposes token trees, which "
                         f"verify={verify!r} cannot verify (it verifies chains): use a tree rule ({tree_rules})"
                         + (", or drop the tree options" if given and spec.name != "tree" else ""))
    for stopping in ("confidence", "stop_head"):
        if options.tree and getattr(options, stopping) is not None:
            raise ValueError(f"{stopping}={getattr(options, stopping)!r} does not apply to tree drafts: it ends a "
                             "chain early, while a tree's shape is fixed by tree_widths / tree_nodes (give one or "
                             "the other)")
    if options.confidence is not None and options.stop_head is not None:
        raise ValueError(f"confidence={options.confidence!r} and stop_head={options.stop_head!r} are two rules "
                         "for ending a draft: give one")
    return spec, verify


def make_drafter(name: str, target, *, exit_layer: int | None = None, exit_adapter: str | None = None,
                 draft_dtype: str | None = None, confidence: float | None = None,
                 tree_widths: tuple[int, ...] | None = None, tree_nodes: int | None = None,
                 draft_corpus: str | None = None, stop_head: str | None = None,
                 stop_threshold: float | None = None) -> Drafter:
    """The drafter registered as `name` (see `DRAFTERS`), drafting for `target`, with the options
    its entry reads (others given are refused, `check_drafter`, as are `confidence` or
    `stop_head` with tree options, `check_speculative`)."""
    options = DrafterOptions(exit_layer, exit_adapter, draft_dtype, confidence, tree_widths, tree_nodes,
                             draft_corpus, stop_head, stop_threshold)
    check_speculative(name, options)
    spec, argument = check_drafter(name, options)
    return spec.factory(target, argument, options)


def check_verification(name: str) -> VerificationSpec:
    """The entry of rule `name`; ValueError naming the known rules for an unknown name."""
    spec = VERIFICATIONS.get(name)
    if spec is None:
        raise ValueError(f"verify={name!r} is not a rule: choose one of {', '.join(VERIFICATIONS)}")
    return spec


def make_verification(name: str) -> Verification:
    """The loop's `Verification` for rule `name` (`check_verification` first)."""
    return check_verification(name).factory()


def default_exit_layer(target) -> int:
    """Exit layer used when none is given: two thirds of the depth (20 of SmolLM2's 30)."""
    return max(1, (2 * target.config.num_hidden_layers) // 3)


_TREE_OPTIONS = ("tree_widths", "tree_nodes")
_STOP_OPTIONS = ("confidence", "stop_head", "stop_threshold")  # a model chain's draft length


def _ngram(target, argument: str | None, options: DrafterOptions) -> Drafter:
    if options.tree:
        from metagen.speculative.ngram_tree import NgramTreeDrafter
        from metagen.speculative.tree_drafter import DEFAULT_MAX_NODES, DEFAULT_WIDTHS

        return NgramTreeDrafter(widths=options.tree_widths or DEFAULT_WIDTHS,
                                max_nodes=options.tree_nodes or DEFAULT_MAX_NODES)
    from metagen.speculative.ngram import NgramDrafter

    return NgramDrafter()


def _drafting(draft, options: DrafterOptions, name: str, share_prompt_cache: bool = False, *,
              tree: bool = False, target=None) -> Drafter:
    """The model `draft` drafting chains (`ModelDrafter`; with a stop head checked against
    `target` and `draft`), or static trees (`TreeDrafter`) when tree options are given or `tree`."""
    if tree or options.tree:
        from metagen.speculative.tree_drafter import DEFAULT_MAX_NODES, DEFAULT_WIDTHS, TreeDrafter

        return TreeDrafter(draft, widths=options.tree_widths or DEFAULT_WIDTHS,
                           max_nodes=options.tree_nodes or DEFAULT_MAX_NODES, name=name,
                           share_prompt_cache=share_prompt_cache)
    from metagen.speculative.drafters import ModelDrafter

    stop_head = None
    if options.stop_head is not None:
        from metagen.speculative.stop_head import StopHead

        stop_head = StopHead.load(options.stop_head, target, draft)
    return ModelDrafter(draft, confidence=options.confidence, name=name, share_prompt_cache=share_prompt_cache,
                        stop_head=stop_head, stop_threshold=options.stop_threshold or 0.5)


def _early_exit_model(target, options: DrafterOptions):
    """The target's first layers (with a trained exit adapter when one is given)."""
    if options.exit_adapter is not None:
        from metagen.speculative.adapter import AdaptedExitModel, ExitAdapter

        adapter = ExitAdapter.load(options.exit_adapter, target)
        if options.exit_layer is not None and options.exit_layer != adapter.num_layers:
            raise ValueError(f"exit_layer={options.exit_layer} differs from the adapter's {adapter.num_layers} layers")
        return AdaptedExitModel(target, adapter)
    from metagen.speculative.self_draft import early_exit_model

    return early_exit_model(target, default_exit_layer(target) if options.exit_layer is None else options.exit_layer)


def _early_exit(target, argument: str | None, options: DrafterOptions) -> Drafter:
    return _drafting(_early_exit_model(target, options), options, "early-exit", share_prompt_cache=True,
                     target=target)


def _quantized(target, argument: str | None, options: DrafterOptions) -> Drafter:
    from metagen.speculative.self_draft import quantized_model

    # the target's prompt keys / values serve the copy too (same layout)
    return _drafting(quantized_model(target, options.draft_dtype or "int4"), options, "quantized",
                     share_prompt_cache=True, target=target)


def _model(target, argument: str | None, options: DrafterOptions) -> Drafter:
    from metagen.models import load

    draft = load(argument, options.draft_dtype or "int4", kv_dtype=target.kv_dtype, activations=target.activations)
    return _drafting(draft, options, "model", target=target)


def _tree(target, argument: str | None, options: DrafterOptions) -> Drafter:
    return _drafting(_early_exit_model(target, options), options, "tree", share_prompt_cache=True, tree=True)


def _spectr_tree(target, argument: str | None, options: DrafterOptions) -> Drafter:
    from metagen.speculative.self_draft import early_exit_model
    from metagen.speculative.tree_drafter import DEFAULT_MAX_NODES, DEFAULT_WIDTHS, TreeDrafter

    draft = early_exit_model(target, default_exit_layer(target) if options.exit_layer is None else options.exit_layer)
    return TreeDrafter(draft, widths=options.tree_widths or DEFAULT_WIDTHS, max_nodes=options.tree_nodes or
                       DEFAULT_MAX_NODES, replacement=True, name="spectr", share_prompt_cache=True)


def _dyspec(target, argument: str | None, options: DrafterOptions) -> Drafter:
    from metagen.speculative.dyspec import DySpecDrafter
    from metagen.speculative.self_draft import early_exit_model
    from metagen.speculative.tree_drafter import DEFAULT_MAX_NODES

    draft = early_exit_model(target, default_exit_layer(target) if options.exit_layer is None else options.exit_layer)
    return DySpecDrafter(draft, max_nodes=options.tree_nodes or DEFAULT_MAX_NODES, share_prompt_cache=True)
def _recycling(target, argument: str | None, options: DrafterOptions) -> Drafter:
    from metagen.speculative.recycling import DEFAULT_MAX_NODES, DEFAULT_WIDTHS, RecyclingDrafter

    return RecyclingDrafter(target.vocab_size, widths=options.tree_widths or DEFAULT_WIDTHS,
                            max_nodes=options.tree_nodes or DEFAULT_MAX_NODES)


def _rasd(target, argument: str | None, options: DrafterOptions, model: Drafter | None = None) -> Drafter:
    from metagen.speculative.rasd import DEFAULT_MAX_NODES, RasdDrafter, load_corpus

    corpus = None if options.draft_corpus is None else load_corpus(options.draft_corpus, target.tokenizer)
    return RasdDrafter(corpus, model=model, max_nodes=options.tree_nodes or DEFAULT_MAX_NODES)


def _rasd_tree(target, argument: str | None, options: DrafterOptions) -> Drafter:
    return _rasd(target, argument, options, _tree(target, argument, options))


def _stand(target, argument: str | None, options: DrafterOptions) -> Drafter:
    from metagen.speculative.stand import DEFAULT_STAND_NODES, DEFAULT_STAND_WIDTHS, StandDrafter

    return StandDrafter(widths=options.tree_widths or DEFAULT_STAND_WIDTHS,
                        max_nodes=options.tree_nodes or DEFAULT_STAND_NODES)


def _medusa(target, argument: str | None, options: DrafterOptions) -> Drafter:
    from metagen.speculative.medusa import DEFAULT_MAX_NODES, DEFAULT_WIDTHS, MedusaDrafter, MedusaHeads

    heads = MedusaHeads.load(argument, target)
    return MedusaDrafter(target, heads, widths=options.tree_widths or DEFAULT_WIDTHS[: heads.num_heads],
                         max_nodes=options.tree_nodes or DEFAULT_MAX_NODES)


def _token() -> Verification:
    from metagen.speculative.rule_verification import RuleVerification
    from metagen.speculative.token_verify import token_verify

    return RuleVerification(token_verify, "token")


def _block() -> Verification:
    from metagen.speculative.block_verify import block_verify
    from metagen.speculative.rule_verification import RuleVerification

    return RuleVerification(block_verify, "block")


def _draw() -> Verification:
    from metagen.decoding.draw_verify import DrawVerification

    return DrawVerification()


def _multi_draft() -> Verification:
    from metagen.speculative.tree_verify import TreeVerification

    return TreeVerification()


def _spectr() -> Verification:
    from metagen.speculative.spectr import SpecTrVerification

    return SpecTrVerification()


register_drafter(DrafterSpec(
    "ngram", "prompt lookup (Saxena 2023), else an n-gram table of past outputs; no model, point-mass drafts "
    "(with tree options: the lookups' distinct continuations as siblings)", _ngram, reads=_TREE_OPTIONS))
register_drafter(DrafterSpec(
    "early-exit", "the target's first layers + its final norm and LM head (Kangaroo-style), sharing its weights; "
    "optionally a trained exit adapter", _early_exit, reads=("exit_layer", "exit_adapter", *_STOP_OPTIONS,
                                                              *_TREE_OPTIONS)))
register_drafter(DrafterSpec(
    "quantized", "a lower-precision copy of the target's checkpoint (refused unless it reads fewer weight bytes)",
    _quantized, reads=("draft_dtype", *_STOP_OPTIONS, *_TREE_OPTIONS)))
register_drafter(DrafterSpec(
    "model", "any model file sharing the target's tokenizer (a smaller model, a compressed copy)", _model,
    reads=("draft_dtype", *_STOP_OPTIONS, *_TREE_OPTIONS), argument="PATH"))

register_verification(VerificationSpec(
    "token", "token verification (Leviathan et al. 2023): accept d with prob min(1, q/p), stop at the first "
    "rejection; greedy verification at temperature 0", _token))
register_verification(VerificationSpec(
    "block", "block verification (Sun et al. 2024): a running ratio over the block, never fewer accepted tokens "
    "than token verification; greedy verification at temperature 0", _block))
register_verification(VerificationSpec(
    "draw", "each token drawn from the target as plain decoding draws it, the draft kept while the draw equals it "
    "(Mirostat allowed; one seeded row gives plain decoding's tokens)", _draw))
register_drafter(DrafterSpec(
    "tree", "a static token tree (SpecInfer-style: widths 2, 2, 1, at most 16 nodes) from the early-exit draft, "
    "verified in one target forward by the multi-draft rule (any drafter given tree options drafts trees)", _tree,
    reads=("exit_layer", "exit_adapter", *_TREE_OPTIONS), verify="multi-draft"))

register_verification(VerificationSpec(
    "multi-draft", "tree verification: recursive rejection sampling over each node's children (Jeon et al. 2024; "
    "SpecInfer), greedy tree verification at temperature 0; verifies tree drafts and chains", _multi_draft,
    trees=True))
register_drafter(DrafterSpec(
    "spectr", "SpecTr's k i.i.d. drafts as a tree: the static tree drawing each node's children with replacement "
    "(widths 2, 2, 1, at most 16 nodes) from the early-exit draft, verified by the spectr rule", _spectr_tree,
    reads=("exit_layer", "tree_widths", "tree_nodes"), verify="spectr"))
register_drafter(DrafterSpec(
    "dyspec", "a dynamic token tree (DySpec, Xiong et al. 2024) from the early-exit draft: the node with the highest "
    "product of draft probabilities grows next, at most 16 nodes; verified by the multi-draft rule", _dyspec,
    reads=("exit_layer", "tree_nodes"), verify="multi-draft"))

register_drafter(DrafterSpec(
    "recycling", "token recycling (Luo et al. 2024): a static tree from a (V, k) matrix of each token's top-k "
    "successors, refreshed from every position the target scores; no model", _recycling,
    reads=("tree_widths", "tree_nodes"), verify="multi-draft"))
register_drafter(DrafterSpec(
    "rasd", "retrieval (RASD, Quan et al. 2025): continuations of the longest suffix match in a corpus, earlier "
    "outputs and the context, merged into a trie; no model", _rasd, reads=("draft_corpus", "tree_nodes"),
    verify="multi-draft"))
register_drafter(DrafterSpec(
    "rasd-tree", "RASD's tree fusion: the retrieval trie and the tree drafter's early-exit tree merged on shared "
    "prefixes", _rasd_tree, reads=("draft_corpus", "exit_layer", "tree_widths", "tree_nodes"), verify="multi-draft"))
register_drafter(DrafterSpec(
    "stand", "STAND (Song et al. 2025): no model; one store per request of the target's observed next-token "
    "distributions per n-gram, shared by its n rows; token trees drawn from it (Gumbel-top-k), verified "
    "losslessly by the multi-draft rule", _stand, reads=("tree_widths", "tree_nodes"), verify="multi-draft"))

register_verification(VerificationSpec(
    "spectr", "tree verification by SpecTr's k-sequential selection over each node's i.i.d. children (Sun et al. "
    "2023; acceptance >= (1 - 1/e) of the optimal k-draft transport), greedy tree verification at temperature 0; "
    "needs children drawn with replacement (the spectr drafter)", _spectr, trees=True, iid_siblings=True))


def _pearl(target, argument: str | None, options: DrafterOptions) -> Drafter:
    from metagen.speculative.pearl import PearlDrafter

    if argument == "early-exit":
        return PearlDrafter(_early_exit_model(target, options), share_prompt_cache=True)
    if options.exit_layer is not None or options.exit_adapter is not None:
        raise ValueError(f"exit_layer / exit_adapter apply to pearl:early-exit, not pearl:{argument}")
    if argument == "quantized":  # the int4 (draft_dtype) copy, sharing the target's prompt cache
        return PearlDrafter(_quantized(target, None, options).model, share_prompt_cache=True)
    return PearlDrafter(_model(target, argument, options).model)


def _pearl_rule() -> Verification:
    from metagen.speculative.pearl import PearlVerification

    return PearlVerification()


register_drafter(DrafterSpec(
    "pearl", "PEARL (Liu et al. 2024): the draft model drafts in a second thread while the target verifies; "
    "pre-verify / post-verify rounds make the draft length adaptive. DRAFT: early-exit, quantized or a model "
    "PATH (metagen serve drafts each request's rounds serially: the engine's one thread runs every forward)", _pearl,
    reads=("exit_layer", "exit_adapter", "draft_dtype"), argument="DRAFT", verify="pearl"))
register_verification(VerificationSpec(
    "pearl", "token verification whose last token is the draft's next token, verified against the target after "
    "the draft (PEARL: no bonus draw); greedy verification at temperature 0", _pearl_rule))


def _s2d(target, argument: str | None, options: DrafterOptions) -> Drafter:
    from metagen.speculative.s2d import SortedDraft

    return SortedDraft.for_target(target, options.exit_layer, options.confidence).drafter(target)


register_drafter(DrafterSpec(
    "s2d", "S2D (Kavehzadeh et al. 2024): one draft for nested targets — the target's model's early exits at "
    "exit_layer / 2 and exit_layer (default a third of its depth); per token the shallowest exit whose top "
    "probability reaches the target's threshold (confidence, default 0.5), the draft ending below it", _s2d,
    reads=("exit_layer", "confidence")))
register_drafter(DrafterSpec(
    "medusa", "Medusa-style draft heads (Cai et al. 2024) on the target's last hidden state, trained on its own text "
    "(metagen train-medusa): their top-k candidates as a token tree (widths 4, 3, 2, at most 16 nodes), no draft "
    "model; verified by the multi-draft rule", _medusa, reads=_TREE_OPTIONS, argument="PATH", verify="multi-draft"))
