"""Process reward models read from transformers checkpoints: Math-Shepherd and Qwen2.5-Math-PRM.

Both score every step of a solution in one forward pass over the question and all its steps,
each step followed by a marker token; the step's score is read at its marker:

    shepherd (Wang et al. 2024, Math-Shepherd): a causal LM over "question step_1 ки\\nstep_2 ки";
        score_k = softmax(z_t[good], z_t[bad])[0]     t: the k-th "ки", z: next-token logits there
    qwen (Zhang et al. 2025, Qwen2.5-Math-PRM): a two-class token head over the chat
        [system, user: question, assistant: "step_1<extra_0>step_2<extra_0>"];
        score_k = softmax(h_t)[1]                      t: the k-th "<extra_0>", h: (2,) class logits

so 0 < score_k < 1 (the two input formats are built in `prm_formats`). The markers are found in
the token ids: the last k positions holding the marker's id (a marker text inside a step is
removed first, so a step cannot forge one; the question may hold one, it precedes them all).

Several solutions are scored in batches of `batch_size`, sorted by length and padded on the
right (causal attention: a real token never sees padding, and its position is unchanged), so a
batched score equals the unpadded one up to float rounding.
Time: ⌈N / batch_size⌉ forwards of ≤ T tokens each. Cost per solution: its real tokens,
flops = 2 · non-embedding params · tokens (as `RewardModelScorer`), all of it scorer FLOPs;
model_calls counts forwards (one per batch).

`--value` names them (`prm_value`): "prm:PATH" (the kind read from PATH/config.json:
`*ForCausalLM` is a Math-Shepherd PRM, `*ForTokenClassification` / `*ProcessRewardModel` a
Qwen-style one), "prm-shepherd:PATH" / "prm-qwen:PATH" (the kind stated), "reward:URL" /
"reward-shepherd:URL" (a vLLM server's pooling API, `remote_prm.PoolingPRM`). A search scores a
partial solution by the min over its steps (as the step verifier and the judge do;
search-and-learn aggregates by "last" or "min").
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from metagen.decoding.cost import Cost
from metagen.scoring.prm_formats import (
    BAD_TOKEN,
    GOOD_TOKEN,
    QWEN,
    QWEN_SYSTEM,
    SEPARATOR,
    SHEPHERD,
    STEP_TAG,
    qwen_messages,
    shepherd_text,
)
from metagen.scoring.process_reward import ProcessRewardModel, StepRewardValue, Values

LOCAL_PREFIXES = {"prm": None, "prm-shepherd": SHEPHERD, "prm-qwen": QWEN}  # None: read from config.json
REMOTE_PREFIXES = {"reward": QWEN, "reward-shepherd": SHEPHERD}
AGGREGATE = "min"


def parse_prm_spec(spec: str | None) -> tuple[str, str | None, str] | None:
    """("local" | "remote", kind or None, path or URL) of a PRM value spec, None for another value."""
    if not spec or ":" not in spec:
        return None
    prefix, _, target = spec.partition(":")
    if prefix in LOCAL_PREFIXES:
        return "local", LOCAL_PREFIXES[prefix], target
    if prefix in REMOTE_PREFIXES:
        return "remote", REMOTE_PREFIXES[prefix], target
    return None


def is_prm_spec(spec: str | None) -> bool:
    return parse_prm_spec(spec) is not None


def marker_positions(ids: Sequence[int], marker_id: int, count: int, marker: str) -> list[int]:
    """The last `count` positions of `marker_id` in `ids`; ValueError when fewer are there."""
    found = [t for t, token in enumerate(ids) if token == marker_id]
    if len(found) < count:
        raise ValueError(f"the PRM input holds {len(found)} {marker!r} tokens (id {marker_id}) for {count} steps: "
                         "the tokenizer does not keep the marker as one token in context")
    return found[len(found) - count:]


def read_config(path: str) -> dict:
    """PATH/config.json; ValueError naming the path when it is not a checkpoint directory."""
    config_file = os.path.join(path, "config.json")
    if not os.path.isfile(config_file):
        raise ValueError(f"value=prm:{path}: {path!r} is not a transformers checkpoint directory (no config.json)")
    with open(config_file, encoding="utf-8") as handle:
        return json.load(handle)


def checkpoint_kind(config: dict, path: str) -> str:
    """SHEPHERD or QWEN from a checkpoint's architectures; ValueError naming the path."""
    architectures = config.get("architectures") or []
    if any(a.endswith(("ForTokenClassification", "ProcessRewardModel")) for a in architectures):
        return QWEN
    if any(a.endswith("ForCausalLM") for a in architectures):
        return SHEPHERD
    raise ValueError(f"value=prm:{path}: architectures {architectures} is neither a causal LM (a Math-Shepherd "
                     "PRM) nor a token classifier (a Qwen2.5-Math-PRM); name the kind with prm-shepherd:PATH "
                     "or prm-qwen:PATH")


class CheckpointPRM(ProcessRewardModel):
    """A PRM from a local transformers directory (nothing downloaded). kind: SHEPHERD or QWEN
    (None: `checkpoint_kind`). step_tag, good_token, bad_token: Math-Shepherd's marker and the two
    tokens compared after it ("good bad" must encode to two ids, as in its model card); separator,
    system: the Qwen format's. A Qwen2.5-Math-PRM checkpoint (`Qwen2ForProcessRewardModel`, whose
    modeling file ships in the directory) is loaded with AutoModel and trust_remote_code, running
    that file; other token classifiers with AutoModelForTokenClassification (num_labels 2).
    Refused before the weights load: a causal LM whose vocabulary lacks the step tag, good or
    bad token (no Math-Shepherd PRM), and a token classifier lacking the separator (TRL-style
    token-classification PRMs are not supported)."""

    def __init__(self, path: str, kind: str | None = None, *, step_tag: str = STEP_TAG, good_token: str = GOOD_TOKEN,
                 bad_token: str = BAD_TOKEN, separator: str = SEPARATOR, system: str = QWEN_SYSTEM,
                 batch_size: int = 4, device: str = "cpu") -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} is out of range: must be >= 1")
        config = read_config(path)
        kind = kind or checkpoint_kind(config, path)
        if kind not in (SHEPHERD, QWEN):
            raise ValueError(f"kind={kind!r} is not known; choose from {SHEPHERD}, {QWEN}")
        try:
            import transformers
        except ImportError as error:
            from metagen.extras import missing

            raise missing("transformers", "process reward models") from error
        self.path, self.kind, self.batch_size, self.device = path, kind, batch_size, device
        self.step_tag, self.separator, self.system = step_tag, separator, system
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
        self._check_vocabulary(kind, good_token, bad_token)  # before the weights load: a cheap refusal
        remote_code = "ProcessRewardModel" in " ".join(config.get("architectures") or []) and "auto_map" in config
        if kind == SHEPHERD:
            loader = transformers.AutoModelForCausalLM
        else:
            loader = transformers.AutoModel if remote_code else transformers.AutoModelForTokenClassification
        model, info = loader.from_pretrained(path, local_files_only=True, trust_remote_code=remote_code,
                                             output_loading_info=True)
        if info.get("missing_keys"):  # a head the file lacks would be random: scores of noise
            raise ValueError(f"value=prm:{path}: the checkpoint lacks weights {sorted(info['missing_keys'])[:4]} "
                             f"of {type(model).__name__}; is it a {kind} PRM?")
        self.model = model.to(device).eval()
        self.marker = step_tag if kind == SHEPHERD else separator
        self.marker_id = self._marker_id()
        if kind == SHEPHERD:
            pair = self.tokenizer.encode(f"{good_token} {bad_token}", add_special_tokens=False)
            if len(pair) != 2:
                raise ValueError(f"good_token={good_token!r}, bad_token={bad_token!r}: '{good_token} {bad_token}' "
                                 f"encodes to {len(pair)} tokens in {path}, not 2")
            self.candidates = pair  # [good, bad]
        else:
            labels = self.model.config.num_labels  # every transformers PretrainedConfig has it
            if labels != 2:
                raise ValueError(f"value=prm-qwen:{path} has num_labels={labels}; a Qwen-style PRM needs 2 (bad, good)")
            if not self.tokenizer.chat_template:
                raise ValueError(f"value=prm-qwen:{path}: the tokenizer has no chat template to format the steps")
        self.parameters = self.model.num_parameters(exclude_embeddings=True)

    def _check_vocabulary(self, kind: str, good_token: str, bad_token: str) -> None:
        """ValueError unless the tokenizer holds the format's tokens, each as one token (its own
        entry of the vocabulary, decoding to itself): Math-Shepherd's step tag, good and bad
        tokens (a causal LM without them is no such PRM: its logits there would be noise), or
        Qwen's separator (a token classifier without it, such as one trained with TRL's
        PRMTrainer, is a format not supported)."""
        if kind == QWEN:
            if not self._one_token(self.separator):
                raise ValueError(f"value=prm:{self.path}: a token classifier whose vocabulary has no token "
                                 f"{self.separator!r} (Qwen2.5-Math-PRM's step separator) is not supported: "
                                 "token-classification PRMs of other formats, such as TRL's PRMTrainer (steps "
                                 "separated by newlines, scored at each step's last token), are not read; "
                                 "metagen reads Qwen2.5-Math-PRM (prm-qwen) and Math-Shepherd (prm-shepherd) PRMs")
            return
        for name, text in (("step_tag", self.step_tag), ("good_token", good_token), ("bad_token", bad_token)):
            if not self._one_token(text):
                raise ValueError(f"value=prm:{self.path}: its vocabulary has no token {text!r} ({name}); a "
                                 f"Math-Shepherd PRM reads P({good_token!r}) against P({bad_token!r}) after each "
                                 f"{self.step_tag!r}, so this causal LM is not one (its scores there would be "
                                 "noise): give a Math-Shepherd checkpoint, or its tokens")

    def _one_token(self, text: str) -> bool:
        """Whether `text` ends in a token of its own: the last id of its encoding decodes to it
        (spaces aside; a sentencepiece tokenizer may put a space piece first)."""
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return bool(ids) and self.tokenizer.decode(ids[-1:]).strip() == text.strip()

    def _marker_id(self) -> int:
        """The marker's id: the separator must be one token; of the step tag, the last token
        counts (as Math-Shepherd's card reads it)."""
        name = "step_tag" if self.kind == SHEPHERD else "separator"
        ids = self.tokenizer.encode(self.marker, add_special_tokens=False)
        if not ids or (self.kind == QWEN and len(ids) != 1):
            raise ValueError(f"{name}={self.marker!r} is {len(ids)} tokens of the tokenizer in {self.path}; "
                             "it must be one token")
        return ids[-1]

    def encode(self, question: str, steps: Sequence[str]) -> list[int]:
        """The token ids the model reads for one solution."""
        if self.kind == SHEPHERD:
            return self.tokenizer.encode(shepherd_text(question, steps, self.step_tag), add_special_tokens=True)
        text = self.tokenizer.apply_chat_template(qwen_messages(question, steps, self.separator, self.system),
                                                  tokenize=False, add_generation_prompt=False)
        return self.tokenizer.encode(text, add_special_tokens=False)  # the template holds the special tokens

    def score_steps(self, prompt: str, steps: Sequence[str]) -> Values:
        return self.score_many(prompt, [steps])[0]

    def score_many(self, prompt: str, solutions: Sequence[Sequence[str]]) -> list[Values]:
        import torch

        encoded = [self.encode(prompt, steps) if steps else [] for steps in solutions]
        positions = [marker_positions(ids, self.marker_id, len(steps), self.marker) if steps else []
                     for ids, steps in zip(encoded, solutions)]
        out = [Values([]) for _ in solutions]
        order = sorted((i for i in range(len(solutions)) if encoded[i]), key=lambda i: len(encoded[i]))
        for first in range(0, len(order), self.batch_size):
            rows = order[first:first + self.batch_size]
            width = max(len(encoded[i]) for i in rows)
            ids = torch.zeros(len(rows), width, dtype=torch.long)  # (B, T), padded on the right
            mask = torch.zeros(len(rows), width, dtype=torch.long)
            for b, i in enumerate(rows):
                ids[b, :len(encoded[i])] = torch.tensor(encoded[i])
                mask[b, :len(encoded[i])] = 1
            with torch.inference_mode():
                output = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                                    return_dict=True)  # a ModelOutput, whatever the config says
            logits = output.logits.float()  # (B, T, V) or (B, T, 2)
            for b, i in enumerate(rows):
                at = logits[b, positions[i]]  # (k, V) or (k, 2)
                if self.kind == SHEPHERD:
                    scores = at[:, self.candidates].softmax(-1)[:, 0]  # P(good) against bad
                else:
                    scores = at.softmax(-1)[:, 1]  # P(positive class)
                tokens = len(encoded[i])
                flops = 2.0 * self.parameters * tokens
                out[i] = Values(scores.tolist(), Cost(model_calls=int(b == 0), prompt_tokens_computed=tokens,
                                                      flops=flops, scorer_flops=flops))
        return out


_loaded: dict[str, ProcessRewardModel] = {}


def load_prm(spec: str, parameters: float | None = None) -> ProcessRewardModel:
    """The PRM a spec names, built once per process (a search builds its value per problem;
    one PRM is kept at a time). parameters: a served PRM's count, for its FLOPs (None: unknown)."""
    key = spec if parameters is None else f"{spec}|{parameters!r}"
    if key not in _loaded:
        where, kind, target = parse_prm_spec(spec)
        if where == "remote":
            from metagen.scoring.remote_prm import PoolingPRM

            prm = PoolingPRM(target, kind, parameter_count=parameters)
        elif not os.path.isdir(target):
            raise ValueError(f"value={spec}: {target!r} is not a directory (a local transformers checkpoint "
                             "of a process reward model)")
        else:
            prm = CheckpointPRM(target, kind)
        release_prms()
        _loaded[key] = prm
    return _loaded[key]


def release_prms() -> None:
    """Drop the PRM `load_prm` holds (a served one's connections closed)."""
    for prm in _loaded.values():
        prm.close()
    _loaded.clear()


def text_value(spec: str, tokenizer, question: str, delimiter: str, parameters: float | None = None) -> StepRewardValue:
    """The value of a spec that reads a solution's text alone: "steps" (`ArithmeticStepVerifier`,
    every equation a step writes checked) or a PRM spec (`prm_value`); min over steps either way.
    tokenizer: decodes token ids for `values` (None: `text_values` only)."""
    if spec == "steps":
        from metagen.scoring.process_reward import ArithmeticStepVerifier

        return StepRewardValue(ArithmeticStepVerifier(), tokenizer, question, delimiter, how=AGGREGATE)
    return prm_value(spec, tokenizer, question, delimiter, parameters)


def prm_value(spec: str, tokenizer, question: str, delimiter: str, parameters: float | None = None) -> StepRewardValue:
    """The PrefixValue of a PRM spec (see the module docstring): the PRM's per-step scores of
    the decoded steps, min over steps; parameters: a served PRM's count (`load_prm`)."""
    if parse_prm_spec(spec) is None:
        raise ValueError(f"value={spec!r} is not a PRM: prm:PATH, prm-shepherd:PATH, prm-qwen:PATH, "
                         "reward:URL or reward-shepherd:URL")
    return StepRewardValue(load_prm(spec, parameters), tokenizer, question, delimiter, how=AGGREGATE)
