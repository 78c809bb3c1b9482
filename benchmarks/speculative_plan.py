"""What benchmarks/speculative.py runs and how it reports, without loading a model (no torch).

The drafters and rules come from metagen's registry (`metagen.speculative.registry`): the
default drafter list is every registered drafter that runs on the target without extra inputs
(`model:PATH` only with `--draft-model PATH`, `medusa:PATH` only with `--medusa-heads PATH`;
`quantized` only when its draft format reads fewer weight bytes than the target's), and every
(drafter, options, rule) goes through `check_speculative` before any model loads, so a bad
combination is refused by name:

    plan_runs("int4", ["ngram"], None, tree={"tree_widths": (2, 2)})   # ngram drafting trees, multi-draft
    plan_runs("int4", ["dyspec"], None, tree={"tree_widths": (2, 2)})  # ValueError: dyspec reads tree_nodes only

Figures per row, summed over a prompt kind's prompts, hardware-independent ones first:
tokens / target forward = generated tokens / target steps (block efficiency; the prefill is a
step, so plain decoding gives 1.00), target forwards / token (its inverse), acceptance =
accepted / proposed draft tokens; then tok/s and the wall-time speedup over plain decoding of
the same engine, target weights and activation codes at the same temperature in the same run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from metagen.speculative.registry import (
    DRAFT_DTYPES,
    DRAFTERS,
    VERIFICATIONS,
    DrafterOptions,
    check_drafter,
    check_speculative,
    check_verification,
)

TARGETS = ("int4", "bf16", "fp32")
ACTIVATIONS = ("int16", "int8")  # the compiled kernels' activation codes (models.load(activations=))
_PRECISION = {"int4": 0, "int8": 1, "bf16": 2, "fp32": 3}
_COMMON = ("exit_layer", "exit_adapter", "draft_dtype", "draft_corpus")  # given to the drafters reading them
_TREE = ("tree_widths", "tree_nodes")


@dataclass(frozen=True)
class Run:
    """One speculative configuration: `drafter` as typed ("ngram", "model:PATH"), the options its
    entry reads, the rule `check_speculative` accepted, adaptive γ or not; `label` for the table."""

    drafter: str
    label: str
    options: DrafterOptions
    verify: str
    adaptive: bool = False


def split_list(text: str | None, flag: str, allowed: tuple[str, ...] | None = None) -> list[str] | None:
    """"a,b" as ["a", "b"] (None for None); ValueError naming `flag` for an empty list or a value
    outside `allowed`."""
    if text is None:
        return None
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise ValueError(f"{flag} {text!r} names nothing: give a comma-separated list")
    bad = [item for item in items if allowed is not None and item not in allowed]
    if bad:
        raise ValueError(f"{flag} {','.join(bad)}: choose from {', '.join(allowed)}")
    return items


def default_drafters(target: str, draft_model: str | None = None, draft_dtype: str | None = None,
                     medusa_heads: str | None = None) -> list[str]:
    """Every registered drafter that runs on a `target` model without extra inputs, in the
    registry's order: an entry taking an argument only with its input (`model:PATH` with
    `draft_model`, `medusa:PATH` with `medusa_heads`), and `quantized` only when its draft
    (`draft_dtype`, default int4) is below the target's precision."""
    inputs = {"model": draft_model, "medusa": medusa_heads}
    names = []
    for spec in DRAFTERS.values():
        if spec.argument is not None:
            if inputs.get(spec.name):
                names.append(f"{spec.name}:{inputs[spec.name]}")
        elif spec.name != "quantized" or _cheaper(draft_dtype, target):
            names.append(spec.name)
    return names


def _cheaper(draft_dtype: str | None, target: str) -> bool:
    return _PRECISION[draft_dtype or "int4"] < _PRECISION[target]


def plan_runs(target: str, drafters: list[str] | None, verifies: list[str] | None, *,
              common: dict | None = None, tree: dict | None = None, adaptive: bool = False,
              draft_model: str | None = None, medusa_heads: str | None = None) -> tuple[list[Run], list[str]]:
    """(runs, notes) for `target`: each drafter (None: `default_drafters`) under each rule of
    `verifies` (None: the rule `check_speculative` picks). `common` options (exit_layer,
    exit_adapter, draft_dtype, draft_corpus) go to the drafters reading them; `tree` options
    (tree_widths, tree_nodes) to every named drafter (one not reading them is refused) or, for the
    default list, to those reading them. A named drafter with a rule it cannot take, or
    `quantized` not cheaper than the target, is refused (ValueError naming them); for the default
    list such a pair is left out and said in `notes`. `adaptive` adds adaptive γ to chain runs.
    Loads nothing."""
    if target not in TARGETS:
        raise ValueError(f"target {target!r}: choose from {', '.join(TARGETS)}")
    named = drafters is not None
    common = {k: v for k, v in (common or {}).items() if v is not None}
    tree = {k: v for k, v in (tree or {}).items() if v is not None}
    unknown = sorted(set(common) - set(_COMMON)) + sorted(set(tree) - set(_TREE))
    if unknown:
        raise ValueError(f"options {', '.join(unknown)} are not benchmark drafter options")
    draft_dtype = common.get("draft_dtype")
    if draft_dtype is not None and draft_dtype not in DRAFT_DTYPES:
        raise ValueError(f"draft_dtype={draft_dtype!r}: choose from {', '.join(DRAFT_DTYPES)}")
    runs, notes = [], []
    for name in drafters if named else default_drafters(target, draft_model, draft_dtype, medusa_heads):
        spec, argument = check_drafter(name)  # an unknown name, named with the known ones
        if spec.name == "quantized" and not _cheaper(draft_dtype, target):
            raise ValueError(f"the quantized drafter on the {target} target: its {draft_dtype or 'int4'} draft is not "
                             "cheaper; use a bf16 / fp32 target or a lower --draft-dtype")
        given = {k: v for k, v in common.items() if k in spec.reads}
        given |= {k: v for k, v in tree.items() if named or k in spec.reads}
        options = DrafterOptions(**given)
        for rule in verifies or [None]:
            try:
                _, verify = check_speculative(name, options, rule)
                if check_verification(verify).iid_siblings and spec.verify != verify:
                    raise ValueError(f"verify={verify!r} needs siblings drawn i.i.d., which the {spec.name} drafter "
                                     f"does not draw: use it with the spectr drafter")
            except ValueError as error:
                if named:
                    raise
                notes.append(f"{target}: {name} with verify={rule} left out ({error})")
                continue
            label = _label(spec.name, argument, options)
            runs.append(Run(name, label, options, verify))
            if adaptive and not VERIFICATIONS[verify].trees:
                runs.append(Run(name, f"{label}, adaptive γ", options, verify, adaptive=True))
    return runs, notes


def _label(name: str, argument: str | None, options: DrafterOptions) -> str:
    """"ngram", "model:draft.gguf", "ngram (widths 2,2; 8 nodes)" for tree options given."""
    label = name if argument is None else f"{name}:{Path(argument).name}"
    shape = []
    if options.tree_widths is not None:
        shape.append("widths " + ",".join(map(str, options.tree_widths)))
    if options.tree_nodes is not None:
        shape.append(f"{options.tree_nodes} nodes")
    return f"{label} ({'; '.join(shape)})" if shape else label


# --------------------------------------------------------------------------- rows and table
@dataclass
class Row:
    engine: str
    target: str
    activations: str  # "int16" / "int8" for metagen targets, "—" for peers
    method: str
    verify: str
    temperature: float
    kind: str
    tokens: int = 0
    seconds: float = 0.0
    decode_seconds: float = 0.0  # metagen only: the call minus its prefill
    draft_tokens: int = 0
    accepted_tokens: int = 0
    target_steps: int = 0  # metagen only: target forwards counted per row, the prefill included
    runs: list[dict] = field(default_factory=list)
    speedup: float | None = None
    decode_speedup: float | None = None

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def decode_tokens_per_second(self) -> float | None:
        return self.tokens / self.decode_seconds if self.decode_seconds else None

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    @property
    def block_efficiency(self) -> float | None:
        """Generated tokens per target forward (1.00 for plain decoding)."""
        return self.tokens / self.target_steps if self.target_steps else None

    @property
    def forwards_per_token(self) -> float | None:
        return self.target_steps / self.tokens if self.tokens and self.target_steps else None

    def summary(self) -> dict:
        return {"tokens_per_second": self.tokens_per_second, "acceptance_rate": self.acceptance_rate,
                "block_efficiency": self.block_efficiency, "target_forwards_per_token": self.forwards_per_token,
                "decode_tokens_per_second": self.decode_tokens_per_second}


def add_speedups(rows: list[Row]) -> None:
    """Each row's tok/s (and decode tok/s) over its plain row: same engine, target, activations,
    temperature and prompt kind."""
    def key(r: Row) -> tuple:
        return r.engine, r.target, r.activations, r.temperature, r.kind

    plain = {key(r): r for r in rows if r.method == "plain"}
    for row in rows:
        base = plain.get(key(row))
        if base is not None and base.tokens_per_second:
            row.speedup = row.tokens_per_second / base.tokens_per_second
        if base is not None and base.decode_tokens_per_second and row.decode_tokens_per_second:
            row.decode_speedup = row.decode_tokens_per_second / base.decode_tokens_per_second


HEADER = ["engine", "target", "act.", "drafter", "rule", "T", "prompts", "tokens / target fwd",
          "target fwd / token", "acceptance", "tok/s", "speedup", "decode tok/s", "decode speedup"]


def table(rows: list[Row]) -> list[list[str]]:
    def fmt(value: float | None, spec: str, suffix: str = "") -> str:
        return "—" if value is None else f"{value:{spec}}{suffix}"

    out = [list(HEADER)]
    for r in rows:
        out.append([r.engine, r.target, r.activations, r.method, r.verify, f"{r.temperature:g}", r.kind,
                    fmt(r.block_efficiency, ".2f"), fmt(r.forwards_per_token, ".3f"), fmt(r.acceptance_rate, ".2f"),
                    f"{r.tokens_per_second:.1f}", fmt(r.speedup, ".2f", "×"),
                    fmt(r.decode_tokens_per_second, ".1f"), fmt(r.decode_speedup, ".2f", "×")])
    return out
