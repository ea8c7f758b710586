"""The causal preflight: causality is proven, not assumed.

Change one later token of a short real sequence and run the CLM forward (family encoder under its causal
mask, then the MLM head) on both: every earlier position's logits must be bitwise the same, and the changed
position's must differ (else the check proves nothing). It runs

- before the first CLM step of every run, on the run's first sequence, model, device and precision
  (preflight_run, called by the training loop);
- when a run or a sweep is validated (`ablate run`, `ablate sweep`, also with --dry-run, `ablate tune`), once
  per distinct model x attention implementation, on the architecture with random weights (check_models),
  together with the checks that need no training: the family entry finds the model's layers, the family
  runs under the implementation, the tokenizer loads; a spec with `document_masking` is checked on three
  packed documents as well (preflight_documents).

Every path a mask kind takes is the one training takes (ablate.train.attention_masks.attention_for), the banded
one (ablate.models.attention: no L x L mask; a prefix pattern as per-row prefix lengths) included.

A leak is a SpecError naming the family, the implementation and what to use instead: exit 2.

May import: config, models, train.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ablate.config import objectives
from ablate.config.errors import SpecError
from ablate.config.spec import RunSpec
from ablate.models.families import Family
from ablate.models.loading import load_config, load_tokenizer, random_masked_lm
from ablate.train.attention_masks import attention_for

PREFLIGHT_TOKENS = 128  # validation length (a run's own check uses its whole first sequence)
_HEAD_CHUNK = 512  # positions per head call: the logits of a long sequence never exist at once
# Real text for validation, before any corpus is read: a run's own check uses its corpus.
PREFLIGHT_TEXT = (
    "The patient, a 64-year-old woman with a history of type 2 diabetes and hypertension, was admitted "
    "with fever, productive cough and shortness of breath. Chest radiography showed a right lower "
    "lobe consolidation, and blood cultures grew Streptococcus pneumoniae. She was treated with "
    "intravenous ceftriaxone and azithromycin and discharged on day six without complications. "
)


@dataclass(frozen=True)
class Preflight:
    family: str
    attn_implementation: str
    length: int
    position: int  # the changed token
    leak: float  # largest |change| of a logit before `position` (0.0: causal)
    reach: float  # largest |change| of a logit at or after `position`
    error: str = ""  # the causal forward itself failed
    pattern: str = objectives.CAUSAL
    prefix_reach: float | None = None  # prefix: |change| at its document's first position (0) when the
    # prefix's last token changes

    @property
    def causal(self) -> bool:
        """The pattern holds: nothing leaks from the future, the change reaches (and a prefix is bidirectional)."""
        prefix_ok = self.prefix_reach is None or self.prefix_reach > 0.0
        return not self.error and self.leak == 0.0 and self.reach > 0.0 and prefix_ok

    def describe(self) -> str:
        head = f"{self.pattern} preflight: {self.family} under {self.attn_implementation}"
        if self.error:
            return f"{head}: the causal forward fails ({self.error})"
        what = (
            "causal"
            if self.causal
            else "LEAKS the future"
            if self.leak != 0.0
            else "inconclusive (the change did not reach the logits)"
        )
        if self.prefix_reach is not None and self.causal:
            what += (
                ", the prefix bidirectional (its last token reaches the start of its document: "
                f"{self.prefix_reach:.3g})"
            )
        elif self.prefix_reach is not None and not self.leak and self.reach > 0.0:
            what = "NOT bidirectional in the prefix (its last token does not reach the start of its document)"
        return (
            f"{head}: {what} (token {self.position} of {self.length} changed; earlier logits max |diff| "
            f"{self.leak:.3g}, later {self.reach:.3g})"
        )


def _hidden(
    model,
    family: Family,
    ids: torch.Tensor,
    device,
    autocast: bool,
    documents=None,
    pattern: str = objectives.CAUSAL,
    prefix: torch.Tensor | None = None,
) -> torch.Tensor:
    dtype = torch.bfloat16 if autocast else torch.float32
    with (
        torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast),
        attention_for(model, family, pattern, ids.shape[1], dtype, device, documents, prefix=prefix) as attn,
    ):
        return family.encoder(model)(input_ids=ids.to(device), attention_mask=attn).last_hidden_state[0]


def measure(
    model,
    family: Family,
    ids: torch.Tensor,
    device: torch.device | str = "cpu",
    autocast: bool = False,
    documents: torch.Tensor | None = None,
    pattern: str = objectives.CAUSAL,
) -> Preflight:
    """Run the preflight on `ids` (1, L) with the model as it is (in eval mode for the duration); with doc
    ids (1, L), under document masking (the changed token then lies in the last document). pattern prefix:
    the first half is the prefix; the changed token lies in the suffix, and the prefix's last token is
    changed too to prove the prefix bidirectional."""
    device = torch.device(device)
    length = ids.shape[1]
    position = max(1, length * 3 // 4)
    prefix = torch.tensor([max(1, length // 2)]) if pattern == objectives.PREFIX else None
    changed = ids.clone()
    changed[0, position] = (int(ids[0, position]) + 1) % model.config.vocab_size
    was_training = model.training
    model.eval()
    leak = reach = 0.0
    impl = model.config._attn_implementation
    try:
        with torch.no_grad():
            try:
                a, b = (
                    _hidden(model, family, x, device, autocast, documents, pattern, prefix) for x in (ids, changed)
                )
                prefix_reach = (
                    None
                    if prefix is None
                    else _prefix_reach(model, family, ids, a, device, autocast, documents, prefix)
                )
            except (RuntimeError, ValueError, TypeError, IndexError) as exc:
                # e.g. DeBERTa-v2's convolution cannot take a pairwise mask
                error = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:160]}"
                return Preflight(family.name, impl, length, position, float("nan"), float("nan"), error, pattern)
            for start in range(0, length, _HEAD_CHUNK):
                la, lb = (family.head_logits(model, h[start : start + _HEAD_CHUNK]).float() for h in (a, b))
                cut = min(max(position - start, 0), la.shape[0])
                if cut and not torch.equal(la[:cut].view(torch.int32), lb[:cut].view(torch.int32)):  # bitwise
                    diff = float((la[:cut] - lb[:cut]).abs().max())
                    leak = max(leak, diff if diff > 0 else float("inf"))  # NaN, or only the sign of a zero
                if cut < la.shape[0]:
                    reach = max(reach, float((la[cut:] - lb[cut:]).abs().max()))
    finally:
        model.train(was_training)
    return Preflight(family.name, impl, length, position, leak, reach, "", pattern, prefix_reach)


def _prefix_reach(
    model,
    family: Family,
    ids: torch.Tensor,
    hidden: torch.Tensor,
    device,
    autocast: bool,
    documents,
    prefix: torch.Tensor,
) -> float:
    """|change| of the logits at the first position of its document (position 0 without documents) when the
    prefix's last token changes (> 0: the prefix is bidirectional)."""
    changed = ids.clone()
    last = int(prefix[0]) - 1
    changed[0, last] = (int(ids[0, last]) + 1) % model.config.vocab_size
    first = 0 if documents is None else int(torch.nonzero(torch.as_tensor(documents)[0] == documents[0][last])[0])
    other = _hidden(model, family, changed, device, autocast, documents, objectives.PREFIX, prefix)
    la, lb = (family.head_logits(model, h[first : first + 1]).float() for h in (hidden, other))
    return float((la - lb).abs().max())


def _failure(
    result: Preflight, instead: list[str], file: str | None = None, key: str = "attn_implementation"
) -> SpecError:
    if instead:
        allowed = "attn_implementation: " + ", ".join(instead)
    else:
        allowed = (
            "none of this family's attention implementations is causal here: MLM-only schedules or another model"
        )
    what = f"a {result.pattern} phase"
    why = (
        f"{what} cannot run"
        if result.error
        else (f"{what} would train on the future" if result.leak else f"{what} would not train its pattern")
    )
    return SpecError(
        f"{result.describe()}: {why}", file=file, key=key, value=result.attn_implementation, allowed=allowed
    )


def checked_patterns(phases) -> tuple[str, ...]:
    """The attention patterns that the preflight proves for these phases (PhaseSpecs): each one that is not
    bidirectional, of every objective (a mixture: every member), and the prefix pattern where a mixture by
    sequence puts rows of different patterns in one micro-batch (they attend by per-row prefix lengths)."""
    found = dict.fromkeys(p for phase in phases for p in _phase_patterns(phase))
    return tuple(p for p in found if p != objectives.BIDIRECTIONAL)


def _phase_patterns(phase) -> tuple[str, ...]:
    found = objectives.patterns_of(phase)
    mixed_rows = getattr(phase, "granularity", None) == "sequence" and len(found) > 1
    return found + ((objectives.PREFIX,) if mixed_rows and objectives.PREFIX not in found else ())


def preflight_run(
    model, family: Family, plans, sequences: np.ndarray, device: torch.device, autocast: bool, log=print
) -> Preflight | None:
    """Before the first step of a run with a causal or prefix pattern: the check of each such pattern on the
    run's first sequence, model, device and precision (None when every phase is bidirectional). A leak or an
    inconclusive check raises SpecError. Returns the last result."""
    result = None
    for pattern in checked_patterns([p.spec for p in plans]):
        result = measure(
            model, family, torch.from_numpy(sequences[:1].astype(np.int64)), device, autocast, pattern=pattern
        )
        log(result.describe())
        if not result.causal:
            raise _failure(result, [i for i in family.attn_implementations if i != result.attn_implementation])
    return result


# --------------------------------------------------------------------------- before anything is submitted


def preflight_ids(tokenizer, vocab_size: int, length: int, seed: int = 0) -> torch.Tensor:
    """(1, length) token ids: PREFLIGHT_TEXT through the tokenizer, repeated; seeded random ids when there is
    no tokenizer at hand (a hub id not in the local cache)."""
    if tokenizer is None:
        return torch.randint(vocab_size, (1, length), generator=torch.Generator().manual_seed(seed))
    once = tokenizer(PREFLIGHT_TEXT, add_special_tokens=True)["input_ids"]
    ids = (once * (length // len(once) + 1))[:length]
    return torch.tensor([ids], dtype=torch.long)


def preflight_documents(length: int) -> torch.Tensor:
    """(1, length) doc ids of three packed documents (the last holds the changed token)."""
    return (torch.arange(length) * 3 // length)[None]


def _preflight_source(
    spec: RunSpec, tokenizer, family: Family, pattern: str = objectives.CAUSAL
) -> tuple[Preflight, list[str]]:
    """The preflight of `pattern` for the spec's model and implementation; when it fails, the family's other
    implementations are tried too, to say which to use instead."""
    vocab = load_config(spec.model).vocab_size
    ids = preflight_ids(tokenizer, vocab, min(spec.data.seq_len, PREFLIGHT_TOKENS))
    documents = preflight_documents(ids.shape[1]) if spec.document_masking else None
    result = measure(
        random_masked_lm(spec.model, spec.attn_implementation), family, ids, documents=documents, pattern=pattern
    )
    instead = []
    if not result.causal:
        instead = [
            impl
            for impl in family.attn_implementations
            if impl != spec.attn_implementation
            and measure(
                random_masked_lm(spec.model, impl), family, ids, documents=documents, pattern=pattern
            ).causal
        ]
    return result, instead


def _grid_key(key: str | None, spec: RunSpec) -> str:
    return f"model (= {spec.model})" if key in (None, "model") else f"{key} (model {spec.model})"


def check_models(specs: list[RunSpec], file: str | None = None) -> dict[tuple, Preflight | None]:
    """Validate each distinct model x tokenizer x attention implementation of `specs` before anything runs:
    family entry and layers, implementation, tokenizer, and the causal preflight when some spec with that
    model has a CLM phase (under document masking too where a spec asks for it). Returns {(model, tokenizer,
    attn_implementation): Preflight, or None without CLM}."""
    from ablate.models.loading import check_attn, model_layout

    done: dict[tuple, Preflight | None] = {}
    proven: set[tuple] = set()  # (key, document_masking, pattern) whose preflight passed
    for spec in specs:
        tok_source = spec.tokenizer or spec.model
        key = (spec.model, tok_source, spec.attn_implementation)
        patterns = [p for p in checked_patterns(spec.phases) if (key, spec.document_masking, p) not in proven]
        if key in done and not patterns:
            continue
        try:
            family, _ = model_layout(spec.model)
            check_attn(load_config(spec.model), spec.attn_implementation)
            tokenizer = load_tokenizer(tok_source, local_only=True)  # its size: plan.model_fit, checked first
        except SpecError as exc:
            raise SpecError(
                exc.message, file=file, key=_grid_key(exc.key, spec), value=exc.value, allowed=exc.allowed
            ) from None
        done.setdefault(key, None)
        for pattern in patterns:
            result, instead = _preflight_source(spec, tokenizer, family, pattern)
            if not result.causal:
                raise _failure(result, instead, file, _grid_key("attn_implementation", spec))
            done[key] = result if done[key] is None or pattern == objectives.CAUSAL else done[key]
            proven.add((key, spec.document_masking, pattern))
    return done
