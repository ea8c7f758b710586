"""Encoder families: one short declarative entry per architecture, all of them here.

An entry says where a *ForMaskedLM keeps its embeddings, its ordered blocks and its MLM head (split into the
transform before the vocabulary projection and that projection's weight and bias, so that the training loop
can fuse the projection with the loss: ablate.train.vocab_loss), which attention implementations it runs
under and how each one receives a causal mask (the kinds are implemented in ablate.train.attention_masks and
proven by ablate.train.preflight), and where LoRA adapters go when it is fine-tuned. Every per-layer feature
(freezing, gradient norms, weight change, CKA) goes through the parameter-name -> layer map built from these
entries.

Adding a family: add an entry to FAMILIES (and its config.model_type values), ship a tiny random config as
ablate/models/configs/<tiny_config>.json with the MiniLM vocabulary; tests/test_families.py runs every
entry through the preflight, a CLM -> MLM run and a fine-tuning.

Imports: config only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Mapping

import torch
from transformers import PretrainedConfig

from ablate.config.errors import SpecError
from ablate.config.registry import Registry

# How an attention implementation receives a causal mask (ablate.train.attention_masks.attention_for):
#   flag            the attention modules' is_causal is set and no mask is passed: SDPA's fused causal kernel
#   additive        a (1, 1, L, L) float mask, 0 / dtype-min, passed through as is and added by eager attention
#   per-layer-type  {layer type: additive mask}, local layers causal AND within their sliding window
#   pairwise-bool   a (1, L, L) bool mask for the encoder, none for the embeddings (DeBERTa multiplies its
#                   embeddings by a 2D padding mask and takes a pairwise one in its own attention)
#   banded          no mask: the model runs under ablate.models.attention for the step (global layers SDPA's
#                   fused kernels with the causal flag, local layers score only the keys inside their window);
#                   for MLM too, where transformers would build (B, 1, L, L) sliding-window masks
MASK_KINDS = ("flag", "additive", "per-layer-type", "pairwise-bool", "banded")
HeadFn = Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]
DecoderFn = Callable[[torch.nn.Module], tuple[torch.Tensor, "torch.Tensor | None"]]


def _modules(*paths: str) -> HeadFn:
    """A transform that applies the model's submodules `paths` (dotted) in order; none: the identity."""

    def transform(model: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        for path in paths:
            hidden = model.get_submodule(path)(hidden)
        return hidden

    return transform


def _linear(path: str) -> DecoderFn:
    """The weight and bias of the model's nn.Linear at `path`: the vocabulary projection."""

    def decoder(model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
        linear = model.get_submodule(path)
        return linear.weight, linear.bias

    return decoder


def _roberta_transform(model: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    head = model.lm_head  # RobertaLMHead.forward up to its decoder: dense, gelu, layer_norm
    return head.layer_norm(torch.nn.functional.gelu(head.dense(hidden)))


def _deberta_transform(model: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    if model.legacy:
        return model.cls.predictions.transform(hidden)
    head = model.lm_predictions.lm_head
    return head.LayerNorm(head.transform_act_fn(head.dense(hidden)))


def _deberta_decoder(model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    # the non-legacy head projects on the word embeddings it is handed (DebertaV2ForMaskedLM.forward)
    if model.legacy:
        return _linear("cls.predictions.decoder")(model)
    return model.deberta.embeddings.word_embeddings.weight, model.lm_predictions.lm_head.bias


@dataclass(frozen=True)
class Family:
    """Where an architecture keeps its parts, and how it takes a causal mask."""

    name: str
    model_types: tuple[str, ...]  # config.model_type values this entry covers
    encoder_attr: str  # the bare encoder inside the *ForMaskedLM; its parameter-name prefix
    embeddings: tuple[str, ...]  # parameter-name prefixes (inside the encoder) of the embedding block
    layers: re.Pattern  # parameter name inside the encoder -> block index
    transform: HeadFn  # hidden states -> what the vocabulary projection reads (the MLM
    # head's dense + activation + norm; run at labelled positions only)
    decoder: DecoderFn  # the vocabulary projection: (weight [vocab, width], bias or None),
    # the weight often tied to the input embeddings
    causal: Mapping[str, str]  # attention implementation -> MASK_KINDS entry; the keys are all it runs
    lora_targets: tuple[str, ...]  # attention projections that get LoRA adapters
    tiny_config: str  # ablate/models/configs/<name>.json: the random config its tests use
    shared: tuple[str, ...] = ()  # other encoder parameters outside the blocks (final norm, relative
    # position embeddings): trained unless `encoder` is frozen
    lora_full: tuple[str, ...] = ()  # modules trained in full under LoRA: possibly fresh (pooler, head)
    rope_thetas: tuple[tuple[str, str], ...] = ()  # a phase's data key (rope_theta, local_rope_theta) -> the
    # layer type whose config.rope_parameters entry it sets
    components: tuple[tuple[str, tuple[str, ...]], ...] = ()  # a block's parts a transplant copies alone
    # (ablate.config.transplants.COMPONENTS) -> parameter-name prefixes
    # inside the block: its attention module, its MLP
    # How its *ForSequenceClassification pools (ablate.evaluate.pooling), one of: a config value per pooling
    # (`classifier_pooling`: our name -> config.classifier_pooling), the module reading position 0 of the last
    # hidden states (`first_token_reader`, dotted from the classification model's root), or the head reading
    # position 0 of the base model's output in its own forward (`first_token_of_output`)
    classifier_pooling: Mapping[str, str] | None = None
    first_token_reader: str | None = None
    first_token_of_output: bool = False
    position_offset: bool = False  # position ids start after pad_token_id (RoBERTa): pad_token_id + 1 fewer
    mlp_matrices: int = 2  # a block's MLP matmuls of hidden x intermediate (a GLU's gate makes 3): its FLOPs

    @property
    def attn_implementations(self) -> tuple[str, ...]:
        return tuple(self.causal)

    def encoder(self, model: torch.nn.Module) -> torch.nn.Module:
        return getattr(model, self.encoder_attr)

    def head_logits(self, model: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        """The MLM head's vocabulary logits, what the model's own forward computes (all of them at once)."""
        return torch.nn.functional.linear(self.transform(model, hidden), *self.decoder(model))

    def rope_layer_types(self, thetas: Mapping[str, float]) -> dict[str, str]:
        """{theta key: layer type} for `thetas` (a phase's rope_theta, local_rope_theta); a key this family
        declares no place for is a SpecError."""
        declared = dict(self.rope_thetas)
        for key, value in thetas.items():
            if key not in declared:
                raise SpecError(
                    f"family {self.name} has no RoPE theta {key!r} to set",
                    key=f"data.{key}",
                    value=value,
                    allowed=", ".join(declared)
                    or "no theta: families that declare one: "
                    + ", ".join(f.name for f in FAMILIES.values() if f.rope_thetas),
                )
        return {key: declared[key] for key in thetas}

    def check_components(self, components: tuple[str, ...], key: str = "components") -> None:
        """A SpecError for a component this family declares no parameters for."""
        declared = dict(self.components)
        for component in components:
            if component not in declared:
                raise SpecError(
                    f"family {self.name} declares no {component!r} component (Family.components in "
                    "ablate/models/families.py)",
                    key=key,
                    value=component,
                    allowed=", ".join(declared) or "none",
                )

    def component_of(self, param_name: str) -> str | None:
        """The component a parameter (of the *ForMaskedLM or its encoder) belongs to; None outside the
        blocks or outside every declared component (a block's norms in some families)."""
        name = param_name.removeprefix(self.encoder_attr + ".")
        m = self.layers.match(name)
        if not m:
            return None
        inside = name[m.end() :]
        return next((c for c, prefixes in self.components if inside.startswith(prefixes)), None)

    def mask_kind(self, attn_implementation: str) -> str:
        try:
            return self.causal[attn_implementation]
        except KeyError:
            raise SpecError(
                f"family {self.name} does not run under attention implementation {attn_implementation!r}",
                key="attn_implementation",
                value=attn_implementation,
                allowed=", ".join(self.causal),
            ) from None


_BERT_LAYERS = re.compile(r"^encoder\.layer\.(\d+)\.")
_QKV = ("query", "key", "value")
# BertLayer and its kin: `attention` (self-attention, output projection, its LayerNorm), `intermediate` and
# `output` (the feed-forward block and its LayerNorm); `attention.output.` starts with `attention.`
_BERT_PARTS = (("attention", ("attention.",)), ("mlp", ("intermediate.", "output.")))

_SHIPPED: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            "bert",
            ("bert",),
            "bert",
            ("embeddings.",),
            _BERT_LAYERS,
            _modules("cls.predictions.transform"),
            _linear("cls.predictions.decoder"),
            {"sdpa": "flag", "eager": "additive"},
            _QKV,
            "tiny-bert",
            lora_full=("pooler",),
            components=_BERT_PARTS,
            first_token_reader="bert.pooler",
        ),
        # also CamemBERT (CamemBERT-bio, DrBERT), XLM-R, BioMed-RoBERTa
        Family(
            "roberta",
            ("roberta", "camembert", "xlm-roberta"),
            "roberta",
            ("embeddings.",),
            _BERT_LAYERS,
            _roberta_transform,
            _linear("lm_head.decoder"),
            {"sdpa": "flag", "eager": "additive"},
            _QKV,
            "tiny-roberta",
            components=_BERT_PARTS,
            first_token_reader="classifier",
            position_offset=True,
        ),
        Family(
            "distilbert",
            ("distilbert",),
            "distilbert",
            ("embeddings.",),
            re.compile(r"^transformer\.layer\.(\d+)\."),
            _modules("vocab_transform", "activation", "vocab_layer_norm"),
            _linear("vocab_projector"),
            {"sdpa": "flag", "eager": "additive"},
            ("q_lin", "k_lin", "v_lin"),
            "tiny-distilbert",
            lora_full=("pre_classifier",),
            components=(("attention", ("attention.",)), ("mlp", ("ffn.",))),
            first_token_of_output=True,
        ),
        # ElectraForMaskedLM is the generator; embeddings_project exists when embedding_size != hidden_size
        Family(
            "electra",
            ("electra",),
            "electra",
            ("embeddings.", "embeddings_project."),
            _BERT_LAYERS,
            _modules("generator_predictions"),
            _linear("generator_lm_head"),
            {"sdpa": "flag", "eager": "additive"},
            _QKV,
            "tiny-electra",
            components=_BERT_PARTS,
            first_token_reader="classifier",
        ),
        # DeBERTa-v3 checkpoints. Disentangled attention has no SDPA path in transformers. The optional convolution
        # (conv_kernel_size > 0: v2-xlarge/xxlarge) mixes neighbouring tokens, the future included, and cannot
        # take a pairwise mask: the preflight rejects such a model for CLM.
        Family(
            "deberta-v2",
            ("deberta-v2",),
            "deberta",
            ("embeddings.",),
            _BERT_LAYERS,
            _deberta_transform,
            _deberta_decoder,
            {"eager": "pairwise-bool"},
            ("query_proj", "key_proj", "value_proj"),
            "tiny-deberta-v2",
            shared=("encoder.rel_embeddings.", "encoder.LayerNorm.", "encoder.conv."),
            lora_full=("pooler",),
            components=_BERT_PARTS,
            first_token_reader="pooler",
        ),
        # sdpa: banded (ablate.models.attention, no L x L mask); eager: today's dense masks per layer type;
        # components are the `attn` and `mlp` modules (the pre-norms attn_norm / mlp_norm are neither)
        Family(
            "modernbert",
            ("modernbert",),
            "model",
            ("embeddings.",),
            re.compile(r"^layers\.(\d+)\."),
            _modules("head"),
            _linear("decoder"),
            {"sdpa": "banded", "eager": "per-layer-type"},
            ("Wqkv",),
            "tiny-modernbert",
            shared=("final_norm.",),
            lora_full=("head",),
            rope_thetas=(("rope_theta", "full_attention"), ("local_rope_theta", "sliding_attention")),
            components=(("attention", ("attn.",)), ("mlp", ("mlp.",))),
            classifier_pooling={"cls": "cls", "mean": "mean"},
            mlp_matrices=3,  # GeGLU: Wi holds the input and the gate
        ),
        Family(
            "eurobert",
            ("eurobert",),
            "model",
            ("embed_tokens.",),
            re.compile(r"^layers\.(\d+)\."),
            _modules(),
            _linear("lm_head"),
            {"sdpa": "flag", "eager": "additive"},
            ("q_proj", "k_proj", "v_proj"),
            "tiny-eurobert",
            shared=("norm.",),
            lora_full=("dense",),
            components=(("attention", ("self_attn.",)), ("mlp", ("mlp.",))),
            classifier_pooling={"cls": "bos", "mean": "mean"},
        ),
    )
}


def _check_family(entry: Family, registry) -> None:
    """An entry that can work: model types of its own, each attention implementation's mask kind a known one."""
    unknown = {kind for kind in entry.causal.values() if kind not in MASK_KINDS}
    if not entry.model_types or unknown:
        raise ValueError(f"family {entry.name!r}: model_types empty or mask kinds {sorted(unknown)} unknown")
    taken = {t: f.name for f in registry.values() if f.name != entry.name for t in f.model_types}
    if any(t in taken for t in entry.model_types):
        raise ValueError(f"family {entry.name!r}: a model type another entry covers ({taken})")


# the registered families (ablate.config.registry: `FAMILIES.register(Family(...))` adds one, checked)
FAMILIES: Registry[Family] = Registry("model family", Family, _check_family)
for _family in _SHIPPED.values():
    FAMILIES.register(_family)

HOW_TO_ADD = "add an entry to FAMILIES in ablate/models/families.py (docs/models.md: Adding a family)"


def family_of(config: PretrainedConfig) -> Family:
    try:
        return next(f for f in FAMILIES.values() if config.model_type in f.model_types)
    except StopIteration:
        raise SpecError(
            f"no family entry for architecture {config.model_type!r}; to add one, {HOW_TO_ADD}",
            key="model",
            value=config.model_type,
            allowed=", ".join(
                f"{f.name} ({', '.join(f.model_types)})" if f.model_types != (f.name,) else f.name
                for f in FAMILIES.values()
            ),
        ) from None


def layer_of(param_name: str, family: Family) -> str:
    """'emb', a block index as a string, 'tail' (shared encoder parameters: final norm, relative position
    embeddings) or 'head' (anything else: MLM head, pooler) for a parameter name of the *ForMaskedLM or of
    its bare encoder."""
    name = param_name.removeprefix(family.encoder_attr + ".")
    if name.startswith(family.embeddings):
        return "emb"
    m = family.layers.match(name)
    if m:
        return m.group(1)
    return "tail" if family.shared and name.startswith(family.shared) else "head"


def layer_index(param_name: str, family: Family) -> int | None:
    """The `layers` table's index of a parameter: -1 embeddings, 0..n-1 blocks, None otherwise."""
    where = layer_of(param_name, family)
    return -1 if where == "emb" else int(where) if where.isdigit() else None


def n_layers(config: PretrainedConfig) -> int:
    return int(config.num_hidden_layers)


def check_layout(model: torch.nn.Module, family: Family) -> None:
    """The family entry finds the model's parts: an embedding block, blocks 0..n-1 (n from the config), and
    no encoder parameter outside them and the shared ones; else a SpecError naming what is missing."""
    depth = n_layers(model.config)
    prefix = family.encoder_attr + "."
    names = [n for n, _ in model.named_parameters()]
    inside = [n for n in names if n.startswith(prefix)]
    where = {n: layer_of(n, family) for n in inside}
    blocks = sorted({int(w) for w in where.values() if w.isdigit()})
    stray = [n for n, w in where.items() if w == "head"]
    problem = None
    if not inside:
        problem = f"no parameter under {prefix!r}"
    elif "emb" not in where.values():
        problem = f"no embedding parameters under {[prefix + e for e in family.embeddings]}"
    elif blocks != list(range(depth)):
        problem = (
            f"blocks {blocks or 'none'} found by the pattern {family.layers.pattern!r}, but the config has "
            f"{depth} layers"
        )
    elif stray:
        problem = f"encoder parameters in no embedding, block or shared group: {stray[:3]}"
    if problem:
        raise SpecError(
            f"family {family.name}: the model's layers cannot be found ({problem}); fix the entry "
            "in ablate/models/families.py",
            key="model",
            value=model.config.model_type,
        )
