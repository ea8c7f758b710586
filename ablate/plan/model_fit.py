"""Run specs against the models they name, from each model's config alone (no weights, no hub): every
length a spec asks for fits the model's positions, the attention implementation is one its family runs
under (eager at most EAGER_MAX_TOKENS tokens), and a local tokenizer's ids fit its vocabulary. What does
not fit is a SpecError before anything is submitted, not a RuntimeError in a job hours later.

Positions: a model takes max_position_embeddings tokens, except RoBERTa-style models, whose position ids
start after the padding index (cumsum of the mask + pad_token_id): max_position_embeddings - pad_token_id - 1
tokens (512 of RoBERTa's 514, pad_token_id 1). The limit is the config's for every family, those that would
run past it (rotary ModernBERT and EuroBERT, relative DeBERTa) included: past it they run outside the
context they were trained for.

Freeze ranges against the depth are plan.grid.resolve_layers' (and plan.phases.check_plan's) job.

May import: config, models, plan.
"""

from __future__ import annotations

from typing import Any

from ablate.config.errors import SpecError
from ablate.config.sources import ROPE_KEYS, phase_rope_thetas
from ablate.config.spec import RunSpec
from ablate.models.families import family_of


def _offset(config: Any) -> bool:
    """Whether the family entry says position ids start after pad_token_id (RoBERTa's)."""
    try:
        return family_of(config).position_offset
    except SpecError:  # no family: the config's own limit
        return False


def usable_positions(config: Any) -> int | None:
    """The most tokens one input of the model may hold (None when its config gives no limit)."""
    n = getattr(config, "max_position_embeddings", None)
    if n is None:
        return None
    if _offset(config):
        return n - (config.pad_token_id or 0) - 1
    return n


def position_limit(config: Any) -> str:
    """How the limit comes from the config, for the error message."""
    n = config.max_position_embeddings
    if _offset(config):
        return (
            f"{usable_positions(config)} positions (max_position_embeddings {n} less the padding offset of "
            f"{(config.pad_token_id or 0) + 1}: {config.model_type} position ids start after pad_token_id)"
        )
    return f"{n} positions (max_position_embeddings)"


def lengths_asked(spec: RunSpec) -> list[tuple[str, int]]:
    """(key, tokens) of every input length the spec asks the model to take."""
    asked = [("data.seq_len", spec.data.seq_len)]
    asked += [
        (f"phases[{i}].data.seq_len", spec.phase_seq_len(i))
        for i in range(len(spec.phases))
        if spec.phase_seq_len(i) != spec.data.seq_len
    ]
    if spec.probe.n_texts:
        asked.append(("probe.max_length", spec.probe.max_length))
    ft_length = spec.eval.finetune.get("max_length")
    if isinstance(ft_length, int) and not isinstance(ft_length, bool):
        asked.append(("eval.finetune.max_length", ft_length))
    return asked


def _where(spec: RunSpec) -> str:
    """The grid point of a sweep's run, for the message ('' for a run spec of its own)."""
    axes = spec.labels.get("axes") if isinstance(spec.labels, dict) else None
    return f" (run {spec.run_id}, axes {axes})" if axes else ""


def check_positions(spec: RunSpec, config: Any, file: str | None) -> None:
    limit = usable_positions(config)
    if limit is None:
        return
    for key, tokens in lengths_asked(spec):
        if tokens > limit:
            raise SpecError(
                f"model {spec.model} takes at most {position_limit(config)}{_where(spec)}",
                file=file,
                key=key,
                value=tokens,
                allowed=f"at most {limit}",
            )


def check_attention(spec: RunSpec, family: Any, file: str | None) -> None:
    if spec.attn_implementation not in family.attn_implementations:
        raise SpecError(
            f"model {spec.model} (family {family.name}) does not run under attention implementation "
            f"{spec.attn_implementation!r}{_where(spec)}",
            file=file,
            key="attn_implementation",
            value=spec.attn_implementation,
            allowed=", ".join(family.attn_implementations),
        )


EAGER_MAX_TOKENS = 4096  # eager attention materialises every layer's weights: (micro-batch, heads, L, L)


def check_rope_thetas(spec: RunSpec, family: Any, file: str | None) -> None:
    """A phase that sets a RoPE theta needs a family that declares which config entry it sets."""
    for i, phase in enumerate(spec.phases):
        thetas = {k: v for k in ROPE_KEYS if (v := getattr(phase.data, k, None)) is not None}
        try:
            family.rope_layer_types(thetas)
        except SpecError as exc:
            raise SpecError(
                f"model {spec.model}: {exc.message}",
                file=file,
                key=f"phases[{i}].{exc.key}",
                value=exc.value,
                allowed=exc.allowed,
            ) from None


def check_eager_length(spec: RunSpec, config: Any, family: Any, file: str | None) -> None:
    """Eager attention keeps each layer's (micro-batch x heads x L x L) float32 weights for backward: past
    EAGER_MAX_TOKENS it is refused, naming what it would hold and the implementation to use instead."""
    if spec.attn_implementation != "eager" or spec.data.seq_len <= EAGER_MAX_TOKENS:
        return
    micro = spec.micro_batch_size or spec.batch_size
    heads = int(getattr(config, "num_attention_heads", 1))
    gib = micro * heads * spec.data.seq_len**2 * 4 / 2**30
    others = [i for i in family.attn_implementations if i != "eager"]
    instead = (
        f"attn_implementation: {', '.join(others)} (fused kernels, no L x L attention weights)"
        if others
        else f"data.seq_len at most {EAGER_MAX_TOKENS} (family {family.name} runs under eager only)"
    )
    raise SpecError(
        f"attn_implementation eager at {spec.data.seq_len} tokens would hold {gib:.1f} GiB of "
        f"attention weights per layer (micro-batch {micro} x {heads} heads x {spec.data.seq_len}^2 x "
        f"4 bytes){_where(spec)}; eager runs at most {EAGER_MAX_TOKENS} tokens",
        file=file,
        key="attn_implementation",
        value="eager",
        allowed=instead,
    )


def local_tokenizer(source: str):
    """The tokenizer when it is on this machine (a package, a folder, the HF cache), else None. A source
    that is no tokenizer at all is train.preflight.check_models' error to report."""
    from ablate.models.loading import load_tokenizer

    try:
        return load_tokenizer(source, local_only=True)
    except SpecError:
        return None


def check_vocabulary(spec: RunSpec, config: Any, file: str | None) -> None:
    source = spec.tokenizer or spec.model
    tokenizer = local_tokenizer(source)
    if tokenizer is not None and len(tokenizer) > config.vocab_size:
        raise SpecError(
            f"the tokenizer {source} has {len(tokenizer)} tokens; model {spec.model} embeds at most "
            f"{config.vocab_size} (vocab_size): its ids past that index nothing",
            file=file,
            key="tokenizer" if spec.tokenizer else "model",
            value=source,
            allowed=f"a tokenizer of at most {config.vocab_size} tokens (the model's own)",
        )


def _config(source: str, file: str | None) -> Any:
    from ablate.models.loading import load_config

    try:
        return load_config(source)
    except SpecError as exc:
        raise SpecError(exc.message, file=file, key="model", value=exc.value, allowed=exc.allowed) from None


def _distinct(specs: list[RunSpec]) -> list[RunSpec]:
    """One spec per combination of what is checked (a sweep's arms and seeds share most of it)."""
    out: dict[tuple, RunSpec] = {}
    for spec in specs:
        thetas = tuple(tuple(sorted(t.items())) for t in phase_rope_thetas(spec.phases).values())
        key = (spec.model, spec.tokenizer, spec.attn_implementation, tuple(lengths_asked(spec)), thetas)
        out.setdefault(key, spec)
    return list(out.values())


def check_model_fit(specs: list[RunSpec], file: str | None) -> None:
    """Every spec against its model's config: input lengths (data.seq_len, probe.max_length with probes
    on, eval.finetune.max_length) within its positions, its attention implementation one the family runs
    under, a local tokenizer within its vocabulary. The first misfit is a SpecError naming `file`, the key,
    the value, the model and its limit."""
    from ablate.models.families import family_of

    configs: dict[str, Any] = {}
    vocab_checked: set[tuple] = set()
    for spec in _distinct(specs):
        if spec.model not in configs:
            configs[spec.model] = _config(spec.model, file)
        config = configs[spec.model]
        check_positions(spec, config, file)
        try:
            family = family_of(config)
        except SpecError as exc:
            raise SpecError(exc.message, file=file, key="model", value=exc.value, allowed=exc.allowed) from None
        check_attention(spec, family, file)
        check_rope_thetas(spec, family, file)
        check_eager_length(spec, config, family, file)
        if (spec.model, spec.tokenizer) not in vocab_checked:
            vocab_checked.add((spec.model, spec.tokenizer))
            check_vocabulary(spec, config, file)
