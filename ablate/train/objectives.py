"""Batches for the two objectives, and the attention mask each one needs.

MLM: mask a fraction of non-special tokens (80% [MASK], 10% random, 10% kept), loss at masked positions.
CLM: next-token labels (labels[t] = input[t+1]), no label across a document boundary or at the last
position, and a causal attention mask. Both return labels with -100 where there is no loss, so the
training loop runs the vocabulary projection only at labelled positions (sparse prediction).

How a causal mask reaches the attention is a property of the family and the attention implementation
(the family entry's `causal`, ablate.models.families.MASK_KINDS); ablate.train.preflight proves each one by
perturbing a later token. Additive masks are float (0 = attend, dtype-min = blocked): transformers passes a
4D mask through unchanged and eager attention adds it, whereas a bool mask would be silently wrong under
eager (see shared notes on causal masks). The banded kind builds no mask at all: the model runs under
ablate.models.attention for the duration of the forward. Document masking (RunSpec.document_masking)
keeps attention inside each packed document under every kind.

May import: config, models.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from ablate.models import attention, flex
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


def dense_mask(seq_len: int, dtype: torch.dtype, device: torch.device | str = "cpu", causal: bool = True,
               window: int | None = None, documents: torch.Tensor | None = None) -> torch.Tensor:
    """(1 or B, 1, L, L) additive mask (dtype-min = blocked; dtype bool: True = attend): k <= q if causal,
    |q - k| <= window if given, and q, k in the same document if doc ids (B, L) are given."""
    q = torch.arange(seq_len, device=device)[:, None]
    k = torch.arange(seq_len, device=device)[None, :]
    allowed = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device)
    if causal:
        allowed &= k <= q
    if window is not None:
        allowed &= (q - k).abs() <= window
    allowed = allowed[None]
    if documents is not None:
        allowed = allowed & (documents[:, :, None] == documents[:, None, :])
    if dtype == torch.bool:
        return allowed[:, None]
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[:, None]


def _causal_flags(model) -> list[torch.nn.Module]:
    """The attention modules: those with a boolean `is_causal`, the switch transformers' SDPA path reads
    when no mask is passed."""
    return [m for m in model.modules() if isinstance(getattr(m, "is_causal", None), bool)]


@contextmanager
def _flags(model, family: Family, causal: bool):
    modules = _causal_flags(family.encoder(model))
    before = [m.is_causal for m in modules]
    for m in modules:
        m.is_causal = causal
    try:
        yield modules
    finally:
        for m, flag in zip(modules, before):
            m.is_causal = flag


@contextmanager
def _registered(model, family: Family, causal: bool, documents: attention.Documents | None,
                block_mask=None):
    """The model under ablate.models.attention's implementation for the duration: its config's
    implementation switched, the attention modules' is_causal set, the documents and the block masks
    attached."""
    with _flags(model, family, causal) as modules:
        configs = {id(c): c for c in (model.config, *(getattr(m, "config", None) for m in modules))
                   if c is not None}
        before = {key: c._attn_implementation for key, c in configs.items()}
        try:
            for c in configs.values():
                c._attn_implementation = attention.IMPLEMENTATION
            for m in modules:
                setattr(m, attention.DOCUMENTS_ATTR, documents)
                setattr(m, attention.FLEX_ATTR, block_mask)
            yield
        finally:
            for key, c in configs.items():
                c._attn_implementation = before[key]
            for m in modules:
                for attr in (attention.DOCUMENTS_ATTR, attention.FLEX_ATTR):
                    if hasattr(m, attr):
                        delattr(m, attr)


@contextmanager
def attention_for(model, family: Family, objective: str, seq_len: int, dtype: torch.dtype,
                  device: torch.device | str = "cpu", documents=None, kind: str | None = None,
                  use_flex: bool | None = None):
    """Yields the attention_mask to pass to the family's encoder for this objective: for MLM None
    (bidirectional, no padding: packed sequences), for CLM what the family's mask kind under the model's
    attention implementation needs. Whatever a kind changes on the model (is_causal flags, an embeddings
    hook, the attention implementation) is restored on exit.

    documents: the batch's doc ids (B, L) when attention stays inside each packed document
    (RunSpec.document_masking), else None. kind: the family's unless given (the benchmark and the tests
    compare kinds on one model).

    flag: SDPA runs its fused causal kernel instead of materialising an L x L mask and attention matrix
    (what BertLMHeadModel does); with documents the model runs under ablate.models.attention, one fused
    call per document. banded: ablate.models.attention (no L x L mask; local layers score their window
    only). The other kinds build dense masks, documents included.

    use_flex (None: on CUDA): with documents, under ablate.models.attention, the global layers' FlexAttention
    block mask, built here once for the micro-batch (ablate.models.flex)."""
    kind = kind or family.mask_kind(model.config._attn_implementation)
    if kind not in MASK_KINDS:
        raise ValueError(f"family {family.name}: unknown mask kind {kind!r}; one of {MASK_KINDS}")
    causal = objective == "clm"
    if kind == "banded" or (kind == "flag" and documents is not None):
        docs = None if documents is None else attention.documents_of(documents, device)
        block_mask = None
        if docs is not None and (use_flex if use_flex is not None else torch.device(device).type == "cuda"):
            block_mask = flex.block_mask(len(docs.ids), seq_len, causal, None, docs.ids, device)
        with _registered(model, family, causal, docs, block_mask):
            yield None
        return
    if documents is not None:
        documents = torch.as_tensor(documents, dtype=torch.long, device=device)
    if not causal and documents is None and kind != "pairwise-bool":
        # (DeBERTa gets its pairwise mask for MLM too: without one its forward reads the ids back to the
        # host in every step, looking for padding; an all-True mask changes no number)
        yield None
    elif kind == "flag":
        with _flags(model, family, True):
            yield None
    elif kind == "pairwise-bool":
        allowed = dense_mask(seq_len, torch.bool, device, causal, documents=documents)[:, 0]   # (1|B, L, L)
        # the embeddings would multiply by the mask as if it were a 2D padding mask: they get none
        hook = family.encoder(model).embeddings.register_forward_pre_hook(
            lambda _module, args, kwargs: (args, {**kwargs, "mask": None}), with_kwargs=True)
        try:
            yield allowed
        finally:
            hook.remove()
    elif kind == "per-layer-type":
        # ModernBERT's local window is |q - k| <= config.sliding_window (masking_utils)
        window = model.config.sliding_window
        yield {"full_attention": dense_mask(seq_len, dtype, device, causal, documents=documents),
               "sliding_attention": dense_mask(seq_len, dtype, device, causal, window, documents)}
    else:                        # additive
        yield dense_mask(seq_len, dtype, device, causal, documents=documents)
