"""Batches for the two objectives, and the attention mask each one needs.

MLM: mask a fraction of non-special tokens (80% [MASK], 10% random, 10% kept), loss at masked positions.
CLM: next-token labels (labels[t] = input[t+1]), no label across a document boundary or at the last
position, and a causal attention mask. Both return labels with -100 where there is no loss, so the
training loop runs the vocabulary projection only at labelled positions (sparse prediction).

How a causal mask reaches the attention is a property of the family and the attention implementation
(the family entry's `causal`, ablate.models.families.MASK_KINDS); ablate.train.preflight proves each one by
perturbing a later token. Additive masks are float (0 = attend, dtype-min = blocked): transformers passes a
4D mask through unchanged and eager attention adds it, whereas a bool mask would be silently wrong under
eager (see shared notes on causal masks).

May import: config, models.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from ablate.models.families import MASK_KINDS, Family

IGNORE = -100


def mlm_inputs(input_ids: torch.Tensor, mask_rate: float, special_ids: torch.Tensor, mask_id: int,
               vocab_size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(masked inputs, labels) with the usual 80/10/10 replacement; special tokens are never masked."""
    candidates = ~torch.isin(input_ids, special_ids)
    draw = torch.rand(input_ids.shape, generator=generator)
    masked = candidates & (draw < mask_rate)
    labels = torch.where(masked, input_ids, torch.full_like(input_ids, IGNORE))

    how = torch.rand(input_ids.shape, generator=generator)
    random_tokens = torch.randint(vocab_size, input_ids.shape, generator=generator)
    inputs = input_ids.clone()
    inputs[masked & (how < 0.8)] = mask_id
    swap = masked & (how >= 0.8) & (how < 0.9)
    inputs[swap] = random_tokens[swap]
    return inputs, labels


def clm_labels(input_ids: torch.Tensor, doc_ids: torch.Tensor) -> torch.Tensor:
    """labels[t] = input_ids[t+1] when t and t+1 belong to the same document, else -100."""
    labels = torch.full_like(input_ids, IGNORE)
    same_doc = doc_ids[:, 1:] == doc_ids[:, :-1]
    labels[:, :-1] = torch.where(same_doc, input_ids[:, 1:], torch.full_like(input_ids[:, 1:], IGNORE))
    return labels


def additive_causal_mask(seq_len: int, dtype: torch.dtype, device: torch.device | str = "cpu",
                         window: int | None = None) -> torch.Tensor:
    """(1, 1, L, L): 0 where query q may attend key k (k <= q, and q - k <= window if given), else dtype-min."""
    q = torch.arange(seq_len, device=device)[:, None]
    k = torch.arange(seq_len, device=device)[None, :]
    allowed = k <= q
    if window is not None:
        allowed &= (q - k) <= window
    mask = torch.zeros(seq_len, seq_len, dtype=dtype, device=device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


def _causal_flags(model) -> list[torch.nn.Module]:
    """The attention modules: those with a boolean `is_causal`, the switch transformers' SDPA path reads
    when no mask is passed."""
    return [m for m in model.modules() if isinstance(getattr(m, "is_causal", None), bool)]


@contextmanager
def attention_for(model, family: Family, objective: str, seq_len: int, dtype: torch.dtype,
                  device: torch.device | str = "cpu"):
    """Yields the attention_mask to pass to the family's encoder for this objective: None (bidirectional, no
    padding: packed sequences) for MLM; for CLM what the family's mask kind under the model's attention
    implementation needs. Whatever a kind changes on the model (is_causal flags, an embeddings hook) is
    restored on exit.

    flag: SDPA runs its fused causal kernel instead of materialising an L x L mask and attention matrix
    (what BertLMHeadModel does)."""
    if objective == "mlm":
        yield None
        return
    config = model.config
    kind = family.mask_kind(config._attn_implementation)
    if kind == "flag":
        modules = _causal_flags(family.encoder(model))
        before = [m.is_causal for m in modules]
        for m in modules:
            m.is_causal = True
        try:
            yield None
        finally:
            for m, flag in zip(modules, before):
                m.is_causal = flag
    elif kind == "pairwise-bool":
        allowed = additive_causal_mask(seq_len, torch.float32, device)[:, 0] == 0     # (1, L, L) bool
        # the embeddings would multiply by the mask as if it were a 2D padding mask: they get none
        hook = family.encoder(model).embeddings.register_forward_pre_hook(
            lambda _module, args, kwargs: (args, {**kwargs, "mask": None}), with_kwargs=True)
        try:
            yield allowed
        finally:
            hook.remove()
    elif kind == "per-layer-type":
        full = additive_causal_mask(seq_len, dtype, device)
        # ModernBERT's bidirectional local window is |q - k| <= config.sliding_window (masking_utils).
        local = additive_causal_mask(seq_len, dtype, device, window=config.sliding_window)
        yield {"full_attention": full, "sliding_attention": local}
    elif kind == "additive":
        yield additive_causal_mask(seq_len, dtype, device)
    else:
        raise ValueError(f"family {family.name}: unknown mask kind {kind!r}; one of {MASK_KINDS}")
