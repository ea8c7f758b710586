"""The attention mask each attention pattern needs (the objectives' batches are their entries',
ablate.config.objectives; mlm_inputs and clm_labels are re-exported here).

Every batch has labels -100 where there is no loss, so the training loop runs the vocabulary projection only
at labelled positions (sparse prediction). A prefix pattern (prefix-LM, or a mixture's rows of different
patterns in one micro-batch) is a per-row prefix: bidirectional is prefix L, causal prefix 0; the dense-mask
kinds build it as a (B, 1, L, L) mask, the banded kind carries the lengths into ablate.models.attention.

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

from ablate.config import objectives
from ablate.config.objectives.clm import clm_labels  # noqa: F401  (re-exported: the batches live in the entries)
from ablate.config.objectives.mlm import mlm_inputs  # noqa: F401
from ablate.models import attention, flex, varlen
from ablate.config.errors import SpecError
from ablate.models.families import MASK_KINDS, Family, family_of

IGNORE = -100


def pattern_of(what: str) -> str:
    """An attention pattern (bidirectional, causal, prefix), or the pattern of a registered objective."""
    return what if what in objectives.PATTERNS else objectives.get(what).pattern


def dense_mask(
    seq_len: int,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    causal: bool = True,
    window: int | None = None,
    documents: torch.Tensor | None = None,
    prefix: torch.Tensor | None = None,
) -> torch.Tensor:
    """(1 or B, 1, L, L) additive mask (dtype-min = blocked; dtype bool: True = attend): k <= q if causal,
    |q - k| <= window if given, and q, k in the same document if doc ids (B, L) are given. prefix (B,), with
    causal: each row's keys k < prefix are seen from every query too (a prefix-LM's bidirectional prefix,
    causal after it), within the window and the document as every key."""
    q = torch.arange(seq_len, device=device)[:, None]
    k = torch.arange(seq_len, device=device)[None, :]
    allowed = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device)[None]
    if causal:
        allowed = allowed & (k <= q)
        if prefix is not None:
            allowed = allowed | (k[None] < prefix.to(device)[:, None, None])
    if window is not None:
        allowed = allowed & ((q - k).abs() <= window)
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
def _registered(model, family: Family, causal: bool, inputs: attention.LayerInputs):
    """The model under ablate.models.attention's implementation for the duration: its config's
    implementation switched, the attention modules' is_causal set, the micro-batch's LayerInputs attached."""
    with _flags(model, family, causal) as modules, _switched(model.config, modules, inputs):
        yield


@contextmanager
def _switched(config, modules: list, inputs: attention.LayerInputs):
    """`config` and the attention modules' configs switched to ablate.models.attention's implementation, and
    `inputs` attached to the modules, for the duration; everything restored on exit."""
    configs = {id(c): c for c in (config, *(getattr(m, "config", None) for m in modules)) if c is not None}
    before = {key: c._attn_implementation for key, c in configs.items()}
    try:
        for c in configs.values():
            c._attn_implementation = attention.IMPLEMENTATION
        for m in modules:
            setattr(m, attention.INPUTS_ATTR, inputs)
        yield
    finally:
        for key, c in configs.items():
            c._attn_implementation = before[key]
        for m in modules:
            if hasattr(m, attention.INPUTS_ATTR):
                delattr(m, attention.INPUTS_ATTR)


@contextmanager
def attention_for(
    model,
    family: Family,
    pattern: str,
    seq_len: int,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    documents=None,
    kind: str | None = None,
    prefix: torch.Tensor | None = None,
    use_flex: bool | None = None,
    kernels: str | None = None,
):
    """Yields the attention_mask to pass to the family's encoder for this attention pattern (bidirectional,
    causal, prefix; or an objective's name, whose entry's pattern it is): bidirectional None (no padding:
    packed sequences), causal what the family's mask kind under the model's attention implementation needs,
    prefix (per-row prefix lengths `prefix` (B,), on the host) a dense per-row mask (_prefix_attention), or
    under the banded kind the lengths carried into ablate.models.attention (no L x L mask).
    Whatever a kind changes on the model (is_causal flags, an embeddings
    hook, the attention implementation) is restored on exit.

    documents: the batch's doc ids (B, L) when attention stays inside each packed document
    (RunSpec.document_masking), else None. kind: the family's unless given (the benchmark and the tests
    compare kinds on one model).

    flag: SDPA runs its fused causal kernel instead of materialising an L x L mask and attention matrix
    (what BertLMHeadModel does); with documents the model runs under ablate.models.attention, one fused
    call per document. banded: ablate.models.attention (no L x L mask; local layers score their window
    only). The other kinds build dense masks, documents included.

    use_flex (None: on CUDA): with a prefix (or documents in float32), under ablate.models.attention, the
    global layers' FlexAttention block mask, built here once for the micro-batch (ablate.models.flex).
    kernels (None: the device's, attention.kernels_for): under ablate.models.attention, which device's paths
    the layers take; "cuda" on the CPU runs CUDA's choices through the kernels' CPU references (tests)."""
    kind = kind or family.mask_kind(model.config._attn_implementation)
    if kind not in MASK_KINDS:
        raise ValueError(f"family {family.name}: unknown mask kind {kind!r}; one of {MASK_KINDS}")
    pattern = pattern_of(pattern)
    causal = pattern == objectives.CAUSAL
    if pattern == objectives.PREFIX and prefix is None:
        raise ValueError("a prefix attention pattern needs the rows' prefix lengths")
    if pattern == objectives.PREFIX and kind != "banded":
        documents = None if documents is None else torch.as_tensor(documents, dtype=torch.long, device=device)
        with _prefix_attention(model, family, kind, seq_len, dtype, device, documents, prefix) as attn:
            yield attn
        return
    if kind == "banded" or (kind == "flag" and documents is not None):
        flex_on = use_flex if use_flex is not None else torch.device(device).type == "cuda"
        with _banded(
            model,
            family,
            seq_len,
            device,
            dtype,
            documents,
            prefix if pattern == objectives.PREFIX else None,
            causal,
            flex_on,
            kernels,
        ):
            yield None
        return
    if documents is not None:
        documents = torch.as_tensor(documents, dtype=torch.long, device=device)
    if not causal and documents is None and kind != "pairwise-bool":
        # (DeBERTa gets its pairwise mask for the bidirectional pattern too: without one its forward reads the
        # ids back to the host in every step, looking for padding; an all-True mask changes no number)
        yield None
    elif kind == "flag":
        with _flags(model, family, True):
            yield None
    elif kind == "pairwise-bool":
        with _pairwise(
            model, family, dense_mask(seq_len, torch.bool, device, causal, documents=documents)
        ) as attn:
            yield attn
    elif kind == "per-layer-type":
        # ModernBERT's local window is |q - k| <= config.sliding_window (masking_utils)
        window = model.config.sliding_window
        yield {
            "full_attention": dense_mask(seq_len, dtype, device, causal, documents=documents),
            "sliding_attention": dense_mask(seq_len, dtype, device, causal, window, documents),
        }
    else:  # additive
        yield dense_mask(seq_len, dtype, device, causal, documents=documents)


@contextmanager
def _banded(
    model, family: Family, seq_len: int, device, dtype, documents, prefix, causal: bool, flex_on: bool, kernels
):
    """Under ablate.models.attention: the documents and the per-row prefix lengths (both from the host, read
    there once); on the CUDA kernels the documents as flash segments, and with `flex_on` the global layers'
    block mask where flash cannot serve them (a prefix; documents in float32)."""
    kernels = kernels or attention.kernels_for(device)
    flash = attention.flash_serves(kernels, torch.device(device).type, dtype)
    # every layer takes flash varlen (attention.route): no kernel reads the doc ids, which stay on the host
    all_flash = flash and prefix is None and not _attention_dropout(model)
    docs = None if documents is None else attention.documents_of(documents, device, ids_read=not all_flash)
    pre = None if prefix is None else attention.prefix_of(prefix, device)
    causal = causal or pre is not None  # a prefix pattern: causal, or a key in the row's prefix
    parts = None
    if docs is not None and kernels == attention.GPU_KERNELS and varlen.AVAILABLE:
        parts = varlen.segments(varlen.offsets(docs.spans, seq_len), seq_len, device)
    block_mask = None
    flash_docs = docs is not None and flash
    if flex_on and (pre is not None or (docs is not None and not flash_docs)):
        rows = len(pre.host) if pre is not None else len(docs.ids)
        block_mask = flex.block_mask(
            rows,
            seq_len,
            causal,
            None,
            None if docs is None else docs.ids,
            device,
            prefix=None if pre is None else pre.lengths,
        )
    with _registered(model, family, causal, attention.LayerInputs(kernels, docs, pre, block_mask, parts)):
        yield


def _attention_dropout(model) -> bool:
    """Whether the model's attention layers drop out in this forward (flash varlen has no dropout: they then
    take the banded and per-document paths)."""
    config = model.config
    rate = getattr(config, "attention_dropout", 0.0) or getattr(config, "attention_probs_dropout_prob", 0.0)
    return bool(model.training and rate)


@contextmanager
def _pairwise(model, family: Family, allowed: torch.Tensor):
    """(1|B, L, L) bool for the encoder; the embeddings would multiply by the mask as if it were a 2D padding
    mask: they get none."""
    hook = family.encoder(model).embeddings.register_forward_pre_hook(
        lambda _module, args, kwargs: (args, {**kwargs, "mask": None}), with_kwargs=True
    )
    try:
        yield allowed[:, 0]
    finally:
        hook.remove()


@contextmanager
def _prefix_attention(
    model,
    family: Family,
    kind: str,
    seq_len: int,
    dtype: torch.dtype,
    device,
    documents,
    prefix: torch.Tensor | None,
):
    """Per-row prefix masks (B, 1, L, L) of the dense-mask kinds: transformers passes a prepared 4D mask
    through unchanged, so the flag kind (SDPA) takes the additive one as eager does. (The banded kind carries
    the prefix lengths into ablate.models.attention instead: _banded.)"""
    prefix = torch.as_tensor(prefix, dtype=torch.long, device=device)
    if kind == "pairwise-bool":
        with _pairwise(
            model, family, dense_mask(seq_len, torch.bool, device, True, documents=documents, prefix=prefix)
        ) as attn:
            yield attn
    elif kind == "per-layer-type":
        window = model.config.sliding_window
        yield {
            "full_attention": dense_mask(seq_len, dtype, device, True, documents=documents, prefix=prefix),
            "sliding_attention": dense_mask(seq_len, dtype, device, True, window, documents, prefix),
        }
    else:  # additive, flag
        yield dense_mask(seq_len, dtype, device, True, documents=documents, prefix=prefix)


@contextmanager
def padded_attention(model, lengths, seq_len: int, device, kernels: str | None = None, flash_dtype: bool = True):
    """A fine-tuning batch of right-padded rows (`lengths`: each row's tokens, host ints) on the CUDA kernels:
    the model's attention modules under ablate.models.attention with each row's tokens as one flash varlen
    segment and its padding as another (what ModernBERT's unpadded training does to a row's tail), so no layer
    scores a padded L x L square or reads the mask back; local layers keep their window. For a family whose
    sdpa path goes through transformers' attention interface (mask kinds "banded" and "flag"; a layer under
    attention dropout keeps SDPA with the mask) on the CUDA kernels (`kernels`: the device's unless given; the
    tests ask for CUDA's on the CPU) when the forward computes in flash's dtypes (`flash_dtype`: bf16
    autocast); otherwise nothing changes (transformers' own attention with the mask)."""
    modules = _causal_flags(model)
    configs = [c for c in {id(c): c for c in (getattr(m, "config", None) for m in modules)}.values() if c]
    ours = bool(configs) and all(_kind_of(c) in ("banded", "flag") for c in configs)
    gpu = (kernels or attention.kernels_for(device)) == attention.GPU_KERNELS
    if not (ours and flash_dtype and varlen.AVAILABLE and gpu):
        yield
        return
    spans = [((0, n), (n, seq_len)) if n < seq_len else ((0, n),) for n in (int(n) for n in lengths)]
    parts = varlen.segments(varlen.offsets(spans, seq_len), seq_len, device)
    with _switched(None, modules, attention.LayerInputs(attention.GPU_KERNELS, segments=parts, padded=True)):
        yield


def _kind_of(config) -> str | None:
    """The mask kind a config's family gives its sdpa implementation (None: a config of no family)."""
    try:
        return family_of(config).causal.get("sdpa")
    except SpecError:
        return None
