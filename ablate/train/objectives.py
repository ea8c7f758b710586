"""Batches for the two objectives, and the attention mask each one needs.

MLM: mask a fraction of non-special tokens (80% [MASK], 10% random, 10% kept), loss at masked positions.
CLM: next-token labels (labels[t] = input[t+1]), no label across a document boundary or at the last
position, and a causal attention mask. Both return labels with -100 where there is no loss, so the
training loop runs the vocabulary projection only at labelled positions (sparse prediction).

Causal masks are 4D float additive masks (0 = attend, dtype-min = blocked): transformers passes a 4D mask
through unchanged, and eager attention adds it, so the same mask is causal under sdpa and eager
(a bool mask would be silently wrong under eager; see shared notes on causal masks). ModernBERT takes a
dict per layer type, so its local layers stay windowed: causal AND within the sliding window.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

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


@contextmanager
def attention_for(model, model_type: str, objective: str, seq_len: int, dtype: torch.dtype,
                  device: torch.device | str = "cpu"):
    """Yields the attention_mask to pass for this objective.

    BERT under sdpa: CLM sets `is_causal` on the self-attention modules for the duration and passes no mask,
    so SDPA runs its fused causal kernel instead of materialising an L x L mask and attention matrix (what
    BertLMHeadModel does); the flag is restored on exit. Everything else: attention_mask_for."""
    config = model.config
    if objective == "clm" and model_type == "bert" and config._attn_implementation == "sdpa":
        modules = [m for m in model.modules() if hasattr(m, "is_causal") and hasattr(m, "attention_head_size")]
        before = [m.is_causal for m in modules]
        for m in modules:
            m.is_causal = True
        try:
            yield None
        finally:
            for m, flag in zip(modules, before):
                m.is_causal = flag
    else:
        yield attention_mask_for(model_type, config, objective, seq_len, dtype, device)


def attention_mask_for(model_type: str, config, objective: str, seq_len: int, dtype: torch.dtype,
                       device: torch.device | str = "cpu"):
    """What to pass as attention_mask: None (bidirectional, no padding: packed sequences) or a causal mask."""
    if objective == "mlm":
        return None
    full = additive_causal_mask(seq_len, dtype, device)
    if model_type == "modernbert":
        # ModernBERT's bidirectional local window is |q - k| <= config.sliding_window (masking_utils).
        local = additive_causal_mask(seq_len, dtype, device, window=config.sliding_window)
        return {"full_attention": full, "sliding_attention": local}
    return full
