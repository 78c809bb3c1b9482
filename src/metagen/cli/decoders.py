"""The token-level decoders of `metagen eval`: --contrastive, --dexperts, --entropy-adaptive and
--adadec, with `metagen generate`'s options and checks (`cli/contrastive.py`, `cli/mixing.py`,
`cli/adadec.py`), applied to every local model of the sweep. Each model's generator is
`LocalGenerator(model, combiner=...)` or `(rerank=...)`, so every sample a strategy draws, pooled
or live, is the decoder's.

- a companion spelled `early-exit:L` is each model's own first L layers (truncated at its turn;
  a model without that form is refused then, naming the option);
- a companion given as a model (a file, an HF directory, a hub name, `embedded`) is loaded once,
  at the first model's turn, and kept for the sweep; at each model's turn it is checked against
  that model's vocabulary (ValueError naming both) before the model generates;
- checked before any model loads: the settings (as `generate` checks them), a companion's file
  or hub name, --backend (refused: a server has no second model here, nor forks of its cache),
  and every --strategy against what the decoding generator provides (`LocalGenerator.provides`
  through `StrategySpec.check`): a strategy that decodes on the model's own cache (pg_td,
  tokenwise_cd) or reads its hidden states would not apply the decoder, and is refused by name.

The decoder and its settings are part of each model's identity in the results
(`eval.fingerprint.decoder_identity`), and of its label: "NAME + contrastive(early-exit:8, α 0.1)".
"""

from __future__ import annotations

import argparse

from metagen.cli import common
from metagen.cli.adadec import adadec_config, add_adadec_options
from metagen.cli.contrastive import (add_contrastive_options, contrastive_options, is_own_model, load_companion,
                                     make_combiner)
from metagen.cli.mixing import add_mixing_options, make_mixing_combiner, mixing_options


def add_decoder_options(parser: argparse.ArgumentParser) -> None:
    """`generate`'s argument groups of --contrastive, --dexperts, --entropy-adaptive and --adadec."""
    add_contrastive_options(parser)
    add_mixing_options(parser)
    add_adadec_options(parser)


class SweepDecoder:
    """The decoder of a sweep, parsed and checked (`sweep_decoder`), its companions not loaded.

    flag: the option that chose it ("contrastive", "dexperts", "entropy-adaptive", "adadec").
    options: the settings dict of `contrastive_options` / `mixing_options`, or the `AdaDecConfig`.
    """

    def __init__(self, flag: str, options, args: argparse.Namespace) -> None:
        self.flag, self.options, self.args = flag, options, args
        self._loaded: dict[str, object] = {}  # spec -> companion loaded once for the sweep

    @property
    def label(self) -> str:
        """How a model's label names the decoder, e.g. "contrastive(early-exit:8, α 0.1)"."""
        return _label(self.flag, self.options)

    @property
    def model_specs(self) -> list[str]:
        """The companions named as models (not `early-exit:L`): loaded once each."""
        if self.flag == "adadec":
            return []
        specs = [self.options["amateur"]] if self.flag == "contrastive" else self.options["models"]
        return [spec for spec in specs if not is_own_model(self.flag, spec)]

    def unloaded(self) -> dict:
        """`LocalGenerator`'s combiner= / rerank= with no companion loaded (None in its place):
        what `LocalGenerator.provides` reads, the decoder's kind."""
        from metagen.decoding.combine import ContrastiveConfig, DExpertsConfig
        from metagen.decoding.entropy_adaptive import EntropyAdaptiveConfig

        if self.flag == "adadec":
            return {"rerank": self.options}
        if self.flag == "contrastive":
            return {"combiner": ContrastiveConfig(amateur=None)}
        if self.flag == "dexperts":
            return {"combiner": DExpertsConfig(expert=None, anti_expert=None)}
        return {"combiner": EntropyAdaptiveConfig(large=None, threshold=self.options["threshold"])}

    def check(self, config) -> None:
        """ValueError naming --`flag` and the first strategy of `config` that the decoding
        generator cannot run (what it lacks, `StrategySpec.check`). Loads nothing."""
        from metagen.decoding import LocalGenerator
        from metagen.strategies.registry import get_strategy

        provided = LocalGenerator.provides(**self.unloaded())
        for name in config.strategies:
            try:
                get_strategy(name).check(provided, config.options, config.params)
            except ValueError as error:
                raise ValueError(f"--{self.flag} cannot evaluate strategy {name!r}: {error}") from None

    def build(self, model) -> dict:
        """combiner= / rerank= of `LocalGenerator` for `model`: its early-exit companions cut from
        it, the others loaded at the first call and kept, each checked against its vocabulary."""
        if self.flag == "adadec":
            return {"rerank": self.options}
        if self.flag == "contrastive":
            return {"combiner": make_combiner(self.options, model, self.args, load=self._companion)}
        return {"combiner": make_mixing_combiner(self.options, model, self.args, load=self._companion)}

    def _companion(self, flag: str, spec: str, model, args: argparse.Namespace):
        """`load_companion`, once per model spec for the sweep; ValueError naming --`flag` when
        it does not share `model`'s vocabulary."""
        from metagen.decoding.combine import check_same_vocabulary

        if is_own_model(flag, spec):
            return load_companion(flag, spec, model, args)  # this model, or its own layers
        if spec not in self._loaded:
            self._loaded[spec] = load_companion(flag, spec, model, args)
        companion = self._loaded[spec]
        try:
            check_same_vocabulary(model, companion)
        except ValueError as error:
            raise ValueError(f"--{flag} {spec}: {error}") from None
        return companion


def sweep_decoder(args: argparse.Namespace) -> SweepDecoder | None:
    """The decoder `eval`'s options ask for, checked as `generate` checks them (--backend refused:
    every model of the sweep must be local), its companion files and hub names checked to exist;
    None without one. Nothing is loaded here."""
    contrastive = contrastive_options(args, excludes=())
    mixing = mixing_options(args, excludes=())
    rerank = adadec_config(args, excludes=())
    if contrastive is not None:
        decoder = SweepDecoder("contrastive", contrastive, args)
    elif mixing is not None:
        decoder = SweepDecoder(mixing["kind"], mixing, args)
    elif rerank is not None:
        decoder = SweepDecoder("adadec", rerank, args)
    else:
        return None
    for spec in decoder.model_specs:
        common.check_model_source(decoder.flag, spec)
    return decoder


def _label(flag: str, options) -> str:
    """The decoder's part of a model's label: its option, companions and every setting, the
    defaults included (a label is read without the command line at hand)."""
    if flag == "adadec":
        return f"adadec(τ {options.threshold:g} bits, B {options.candidates}, L {options.lookahead})"
    names = [_companion_name(flag, spec) for spec in
             ([options["amateur"]] if flag == "contrastive" else options["models"])]
    if flag == "contrastive":
        settings = [f"α {options['alpha']:g}"]
        if options["amateur_temperature"] != 1.0:
            settings.append(f"T {options['amateur_temperature']:g}")
        if options["beta"] is not None:
            settings.append(f"β {options['beta']:g}")
    elif flag == "dexperts":
        settings = [f"α {options['alpha']:g}"]
    else:
        settings = [f"τ {options['threshold']:g} bits", f"w {options['window']}"]
    return f"{flag}({', '.join(names + settings)})"


def _companion_name(flag: str, spec: str) -> str:
    """`early-exit:L` and `main` as typed, a model by its short name (`common.local_names`)."""
    return spec if is_own_model(flag, spec) else common.local_names(spec)[0]
