"""RunSpec: the one currency between modules.

A RunSpec says everything a run does: which model and data, which phases with which objective, length,
learning-rate schedule and freeze mask. It is validated on load (unknown keys, bad values and missing
pieces are errors that name the file and key path) and it is immutable. Its id is a short hash of the
fields that change what is trained, so the same spec always maps to the same run folder, and labels or
evaluation settings can change without re-training.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from ablate.config import identity
from ablate.config.base import Located, Strict, read_yaml, unique_items, validate
from ablate.config.sources import PhaseData, SourceSpec, check_members, steps_by_length

FREEZE_WORDS = ("none", "embeddings", "low", "mid", "high", "encoder", "head")
FREEZE_ALLOWED = "none, embeddings, low, mid, high, encoder, head, or a layer range like 0-7 or 3"


class LRSchedule(Strict):
    """Per-phase LR multiplier shape. The scheduler restarts at each phase; the optimizer state does not."""

    peak_lr: float | None = Field(default=None, gt=0, description="defaults to optim.lr")
    warmup_steps: int = Field(default=0, ge=0, description="steps of linear warm-up from 0 to the peak")
    warmup_fraction: float = Field(default=0.0, ge=0, lt=1, description="of the phase's steps")
    decay: Literal["constant", "linear", "1-sqrt", "cosine"] = Field(
        default="constant", description="the LR's shape after the warm-up, down to final_fraction of the peak"
    )
    final_fraction: float = Field(default=0.0, ge=0, le=1, description="LR at the end, as a fraction of peak")

    @model_validator(mode="after")
    def _one_warmup(self):
        if self.warmup_steps and self.warmup_fraction:
            raise ValueError("give warmup_steps or warmup_fraction, not both; allowed: one of them")
        # compared with the default, not with what was written: a dumped spec (spec.json) writes every field
        if self.decay == "constant" and self.final_fraction != 0.0:
            raise Located(
                "a constant LR never decays to final_fraction: give decay too",
                "final_fraction",
                self.final_fraction,
                "decay: linear, 1-sqrt or cosine",
            )
        return self


CORRUPTION_ALLOWED = "80/10/10, mask (always [MASK]), or [mask, random, keep] shares adding up to 1"


class ObjectiveFields(Strict):
    """An objective and the fields it reads (ablate.config.objectives: each entry says which; None is "not
    written", so fields added later leave the ids of older runs as they were)."""

    objective: str = Field(description="a registered objective: clm, mlm, mntp, prefix-lm, span, or mixture")
    mask_rate: float | None = Field(
        default=None,
        description="masking objectives; default 0.15 (with mask_rate_end: the rate at the phase's start)",
    )
    mask_rate_end: float | None = Field(
        default=None, description="a linear masking-rate schedule over the phase from mask_rate to this rate"
    )
    corruption: tuple[float, float, float] | None = Field(default=None, description=CORRUPTION_ALLOWED)
    span_length: float | None = Field(default=None, ge=1, description="span: the spans' mean length (default 3)")

    @field_validator("objective")
    @classmethod
    def _registered(cls, v):
        from ablate.config.objectives import get

        get(v)
        return v

    @field_validator("corruption", mode="before")
    @classmethod
    def _corruption(cls, v):
        if v is None:
            return None
        named = {"80/10/10": (0.8, 0.1, 0.1), "mask": (1.0, 0.0, 0.0)}
        shares = named.get(v) if isinstance(v, str) else v
        if (
            not isinstance(shares, (list, tuple))
            or len(shares) != 3
            or any(isinstance(x, bool) or not isinstance(x, (int, float)) or x < 0 for x in shares)
        ):
            raise ValueError(f"unknown corruption {v!r}; allowed: {CORRUPTION_ALLOWED}")
        if not math.isclose(sum(shares), 1.0, abs_tol=1e-9):
            raise ValueError(f"corruption shares add up to {sum(shares):g}, not 1; allowed: {CORRUPTION_ALLOWED}")
        shares = tuple(float(x) for x in shares)
        return None if shares == (0.8, 0.1, 0.1) else shares  # the default is one identity, written or not

    @model_validator(mode="after")
    def _objective_reads(self):
        from ablate.config.objectives import get

        get(self.objective).check(self)
        for key in ("mask_rate", "mask_rate_end"):
            value = getattr(self, key)
            if value is not None and not 0 < value < 1:
                raise Located(f"{key} must be in (0, 1)", key, value, "a rate in (0, 1)")
        return self


class MixtureMember(ObjectiveFields):
    weight: float = Field(gt=0, description="relative share of the steps, micro-batches or sequences")


class PhaseSpec(ObjectiveFields):
    name: str = Field(
        min_length=1,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="what freeze masks, tables and records call the phase; unique within a run",
    )
    mixture: tuple[MixtureMember, ...] | None = Field(default=None, description="objective mixture: its members")
    granularity: Literal["step", "micro-batch", "sequence"] | None = Field(
        default=None, description="objective mixture: what one draw of a member trains (default step)"
    )
    steps: int | None = Field(
        default=None,
        gt=0,
        description="the phase's length in optimizer steps (give one of steps, tokens, fraction)",
    )
    tokens: int | None = Field(
        default=None, gt=0, description="the phase's length in training tokens, rounded up to whole steps"
    )
    fraction: float | None = Field(default=None, gt=0, le=1, description="of the run's budget_tokens")
    lr: LRSchedule = Field(default=LRSchedule(), description="the phase's learning-rate schedule")
    freeze: tuple[str, ...] = Field(
        default=("none",), description=f"layers left untouched: {FREEZE_ALLOWED}; a grid's freeze masks add to it"
    )
    data: PhaseData | None = Field(
        default=None, description="this phase's corpus, mixture or seq_len, where they differ from the run's data"
    )

    @field_validator("freeze", mode="before")
    @classmethod
    def _freeze_list(cls, v):
        if isinstance(v, (str, int)) and not isinstance(v, bool):
            v = [v]
        if not isinstance(v, (list, tuple)) or any(
            isinstance(x, bool) or not isinstance(x, (str, int)) for x in v
        ):
            raise ValueError(f"a freeze mask is a group or a list of groups, got {v!r}; allowed: {FREEZE_ALLOWED}")
        return tuple(str(x).strip() for x in v)

    @field_validator("freeze")
    @classmethod
    def _freeze_words(cls, v):
        for item in v:
            if item not in FREEZE_WORDS and parse_layer_range(item) is None:
                raise ValueError(f"unknown freeze group {item!r}; allowed: {FREEZE_ALLOWED}")
        if "none" in v and len(v) > 1:
            raise ValueError("'none' cannot be combined with other freeze groups; allowed: 'none' alone")
        return v

    @model_validator(mode="after")
    def _check(self):
        given = [k for k in ("steps", "tokens", "fraction") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                f"a phase needs exactly one length: steps, tokens or fraction (got {given or 'none'}); "
                "allowed: one of steps: N, tokens: N, fraction: F"
            )
        return self


class DataSpec(Strict):
    corpus: str | None = Field(
        default=None, description="path under the data root (or absolute), or hf:NAME for a datasets dataset"
    )
    mixture: tuple[SourceSpec, ...] | None = Field(default=None, description="weighted corpora instead of one")
    format: Literal["auto", "text", "jsonl", "parquet", "hf"] = Field(
        default="auto",
        description="how the corpus is read; auto: from the files' suffixes (.txt one document "
        "a line, .jsonl, .parquet)",
    )
    text_field: str = Field(default="text", description="jsonl, parquet, hf: the field holding each document")
    valid_corpus: str | None = Field(default=None, description="held-out texts for layer probes")
    max_documents: int | None = Field(default=None, gt=0, description="use only the first N documents")
    seq_len: int = Field(default=128, ge=8, description="tokens per packed training sequence")
    data_seed: int = Field(default=42, description="the order documents are packed and read in")
    data_root: str | None = Field(default=None, description="overrides ABLATE_DATA_ROOT")
    errors: Literal["strict", "replace"] = Field(
        default="strict", description="invalid UTF-8: an error, or replaced by U+FFFD"
    )
    prepared_root: str | None = Field(
        default=None,
        description="where prepared token shards live; overrides ABLATE_PREPARED (default: the cache)",
    )
    max_epochs: float = Field(
        default=1.0,
        gt=0,
        description="how many times a run may read its corpus; a run planned to read it more often is refused",
    )

    @model_validator(mode="after")
    def _text_field_read(self):
        if (self.corpus is None) == (self.mixture is None):
            raise Located(
                "data reads a corpus or a mixture of corpora, exactly one",
                "corpus",
                self.corpus,
                "corpus: NAME, or mixture: [{corpus: NAME, weight: W}, ...]",
            )
        check_members(self.mixture)
        if self.format == "text" and self.text_field != "text":
            raise Located(
                "a text corpus has one document per line and no fields",
                "text_field",
                self.text_field,
                "text_field with format jsonl, parquet or hf",
            )
        return self


class OptimSpec(Strict):
    """AdamW. `weight_decay_form: composer` is the recipe's (Composer's DecoupledAdamW): each step a decayed
    weight is multiplied by 1 - (lr_t / lr) x weight_decay, lr being this peak (1e-5 a step at peak).
    `torch` is torch.optim.AdamW's 1 - lr_t x weight_decay (2e-9 a step at the recipe's values: in float32
    a weight stays bitwise unchanged)."""

    lr: float = Field(default=2e-4, gt=0, description="the peak learning rate (a phase's lr.peak_lr overrides it)")
    betas: tuple[float, float] = Field(default=(0.9, 0.98), description="AdamW's beta1, beta2")
    eps: float = Field(default=1e-6, gt=0, description="AdamW's epsilon")
    weight_decay: float = Field(default=1e-5, ge=0, description="decoupled weight decay (see weight_decay_form)")
    weight_decay_form: Literal["composer", "torch"] = Field(
        default="composer", description="composer: decay scaled by lr_t / lr; torch: by lr_t (see above)"
    )
    grad_clip: float | None = Field(default=1.0, gt=0, description="gradient norm clipped to this; null: none")


PROBE_TASK = "task:"  # probe.texts: task:NAME[:SPLIT], a task's texts (ablate.analysis.probe)
PROBE_SPLITS = ("train", "dev", "test", "all")


class ProbeSpec(Strict):
    """Per-layer CKA against the base model at the end of each phase (off when n_texts is 0)."""

    n_texts: int = Field(
        default=0,
        ge=0,
        description="held-out texts the layers are measured on (drawn from probe.texts); 0: no probe",
    )
    max_length: int = Field(default=128, ge=8, description="tokens per probe text")
    seed: int = Field(default=0, description="which held-out texts are drawn")
    texts: tuple[str, ...] | None = Field(
        default=None,
        description="where the probe texts come from: "
        "task:NAME (that task's test split), task:NAME:SPLIT (train, dev, "
        "test or all), or a corpus path; a list pools them and n_texts are "
        "drawn from the pool; null: data.valid_corpus",
    )

    @field_validator("texts", mode="before")
    @classmethod
    def _one_or_more(cls, value):
        return (value,) if isinstance(value, str) else value

    @field_validator("texts")
    @classmethod
    def _sources(cls, value):
        if value is None:
            return value
        if not value:
            raise ValueError("no source; allowed: at least one source, or null for data.valid_corpus")
        for source in value:
            if source.startswith(PROBE_TASK):
                name, _, split = source[len(PROBE_TASK) :].partition(":")
                if not name or (split and split not in PROBE_SPLITS):
                    raise ValueError(
                        f"{source!r} is no task source; allowed: task:NAME or task:NAME:SPLIT, SPLIT one of "
                        f"{', '.join(PROBE_SPLITS)}"
                    )
            elif not source.strip():
                raise ValueError("an empty source; allowed: a corpus path, task:NAME or task:NAME:SPLIT")
        if len(set(value)) != len(value):
            raise ValueError("a source listed twice; allowed: each source once")
        return value


class EvalSpec(Strict):
    tasks: tuple[str, ...] = Field(
        default=(),
        description="fine-tuning tasks after pretraining: task names "
        "(grids/tasks) or suite:NAME (grids/suites); none: no fine-tuning",
    )
    seeds: tuple[int, ...] = Field(default=(0,), description="fine-tuning seeds, each task once per seed")
    finetune: dict[str, Any] = Field(
        default_factory=dict, description="overrides of the tasks' fine-tuning defaults"
    )
    protocol: str | None = Field(
        default=None,
        description="a fine-tuning profile of ablate.evaluate.protocol "
        "(paper, smoke) over the task files; null: the files'",
    )
    units_per_gpu: Annotated[int, Field(gt=0)] | Literal["auto"] = Field(
        default="auto",
        description="fine-tunings (one task, one seed each) run at once on each GPU, each a process of its "
        "own: auto, as many as each task's predicted peak fits (1 without GPU); a number (the CPU too); 1: "
        "one after another in the run's process; the same scores either way (docs/cluster.md)",
    )

    @field_validator("seeds")
    @classmethod
    def _each_seed_once(cls, seeds):
        return unique_items(seeds, "fine-tuning seed")

    @model_validator(mode="before")
    @classmethod
    def _units_per_gpu(cls, data):
        value = data.get("units_per_gpu", "auto") if isinstance(data, dict) else "auto"
        if value != "auto" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise Located(
                "not a number of fine-tunings at once", "units_per_gpu", value, "auto, or a whole number >= 1"
            )
        return data


class TensorBoardSpec(Strict):
    log_dir: str | None = Field(
        default=None, description="event files go to LOG_DIR/<run_id>; default: <run folder>/tensorboard"
    )


class MlflowSpec(Strict):
    uri: str | None = Field(
        default=None,
        description="tracking URI (sqlite:///..., http://server:5000) or a "
        "local folder (its mlflow.db); default: <sweep>/mlflow.db",
    )
    experiment: str | None = Field(default=None, description="default: the sweep's name")
    log_model: bool = Field(default=False, description="log the final model folder as an artifact")


class WandbSpec(Strict):
    project: str | None = Field(default=None, description="default: the sweep's name")
    dir: str | None = Field(default=None, description="where wandb/offline-run-* go; default: the run folder")


class TrackingSpec(Strict):
    """Live views of a run in the researcher's tracker (several at once; all off by default).
    `tensorboard: true` is `tensorboard: {}`; false or absent is off. W&B runs offline only: sync later with
    `wandb sync`."""

    tensorboard: TensorBoardSpec | None = Field(
        default=None, description="TensorBoard event files (true: the defaults)"
    )
    mlflow: MlflowSpec | None = Field(default=None, description="an MLflow run per run (true: the defaults)")
    wandb: WandbSpec | None = Field(default=None, description="an offline W&B run per run (true: the defaults)")

    @field_validator("tensorboard", "mlflow", "wandb", mode="before")
    @classmethod
    def _switch(cls, v):
        return {} if v is True else None if v is False else v

    @property
    def enabled(self) -> tuple[str, ...]:
        return tuple(n for n in ("tensorboard", "mlflow", "wandb") if getattr(self, n) is not None)


class RunSpec(Strict):
    model: str = Field(
        description="package:MODULE, a local folder, hub:ORG/NAME (or ORG/NAME), or config:NAME|PATH "
        "for a random init"
    )
    tokenizer: str | None = Field(default=None, description="same forms as model; defaults to the model's")
    attn_implementation: Literal["sdpa", "eager"] = Field(
        default="sdpa", description="the encoder's attention kernel: torch's scaled dot product, or plain matmuls"
    )
    document_masking: bool = Field(
        default=False,
        description="attention stays inside each packed document "
        "(as unpadded varlen training); in the run id when on",
    )
    data: DataSpec = Field(description="the pretraining corpus and how it is read and packed")
    batch_size: int = Field(default=16, gt=0, description="sequences per optimizer step")
    micro_batch_size: Annotated[int, Field(gt=0)] | Literal["auto"] | None = Field(
        default=None,
        description="sequences per forward/backward (gradient accumulation); auto, in a grid whose "
        "launcher states gpu_memory_gb: the largest divisor of the per-rank batch that "
        "fits the GPU (docs/gpu-memory.md)",
    )
    seed: int = Field(default=17, description="the pretraining seed: initialisation of new weights, masking draws")
    budget_tokens: int | None = Field(default=None, gt=0, description="what phase fractions are fractions of")
    phases: tuple[PhaseSpec, ...] = Field(description="the phases, in order (in a grid: prelude + a schedule)")
    optim: OptimSpec = Field(
        default=OptimSpec(), description="the optimizer (AdamW), its state kept across phases"
    )
    checkpoint_every: int = Field(default=50, gt=0, description="optimizer steps")
    log_every: int = Field(default=10, gt=0, description="optimizer steps between curve points")
    device: Literal["auto", "cpu", "cuda"] = Field(default="auto", description="auto: CUDA when there is one")
    precision: Literal["auto", "bf16", "fp32"] = Field(
        default="auto",
        description="auto: bf16 autocast on CUDA, float32 on the CPU; bf16 (autocast, float32 master "
        "weights) or fp32 on any device",
    )
    compile: Literal["auto", True, False] = Field(
        default="auto",
        description="torch.compile the encoder: auto is on for CUDA and off on the CPU (where "
        "compiling costs more than it saves on short runs); true or false on any device",
    )
    deterministic: bool = Field(
        default=False,
        description="deterministic algorithms (torch, cuDNN, cuBLAS): "
        "repeatable CUDA steps at some speed; no change on CPU",
    )
    vocab_loss: Literal["fused", "dense"] = Field(
        default="fused",
        description="the MLM head's vocabulary projection + cross-entropy: fused (a chunk of "
        "positions at a time, never all logits at once) or dense (all logits, as the "
        "model's own forward); the same loss and gradients up to float rounding",
    )
    probe: ProbeSpec = Field(default=ProbeSpec(), description="per-layer measures at each phase end")
    eval: EvalSpec = Field(default=EvalSpec(), description="fine-tuning on downstream tasks after pretraining")
    tracking: TrackingSpec = Field(default=TrackingSpec(), description="live views in TensorBoard, MLflow, W&B")
    labels: dict[str, Any] = Field(
        default_factory=dict, description="names that do not change training (sweep, axis values)"
    )
    branching: bool = Field(
        default=True,
        description="may start from another run's checkpoint of the same "
        "sweep where both compute the same first steps (false: "
        "always from step 0); the same bits either way",
    )

    @field_validator("phases")
    @classmethod
    def _phase_list(cls, phases):
        if not phases:
            raise ValueError("at least one phase is needed; allowed: a list of phases")
        names = [p.name for p in phases]
        if len(set(names)) != len(names):
            raise ValueError(f"phase names must be unique, got {names}; allowed: distinct names")
        return phases

    @model_validator(mode="after")
    def _check(self):
        fractions = [p.fraction for p in self.phases if p.fraction is not None]
        if fractions and self.budget_tokens is None:
            raise Located(
                "a phase length given as a fraction needs budget_tokens",
                "budget_tokens",
                None,
                "budget_tokens: N, or phase lengths in steps or tokens",
            )
        if fractions and not math.isclose(sum(fractions), 1.0, rel_tol=0, abs_tol=1e-9):
            raise Located(
                f"the phases' fractions of budget_tokens add up to {sum(fractions):g}, not 1: "
                f"{' + '.join(f'{f:g}' for f in fractions)}",
                "phases",
                sum(fractions),
                "fractions adding up to 1 (give the rest as a fraction too), or lengths in steps or tokens",
            )
        mb = self.micro_batch_size
        if isinstance(mb, int) and self.batch_size % mb:
            raise Located(
                f"batch_size {self.batch_size} is not a multiple of micro_batch_size {mb}",
                "micro_batch_size",
                mb,
                f"a divisor of batch_size {self.batch_size}",
            )
        return self

    @property
    def run_id(self) -> str:
        """A short hash of what trains the run (ablate.config.identity declares which fields)."""
        return identity.digest(identity.content(self.model_dump(mode="json"), identity.RUN), 12)

    @property
    def training_identity(self) -> str:
        """A digest of what trains the run apart from its phases and seed: the runs of two arms (or two seeds)
        at one grid point share it (the pairs table, layer transplants)."""
        return identity.digest(identity.content(self.model_dump(mode="json"), identity.ARM), 16)

    @property
    def tokens_per_step(self) -> int:
        """Of the run's data.seq_len (a phase with its own seq_len: phase_tokens_per_step)."""
        return self.batch_size * self.data.seq_len

    def phase_seq_len(self, index: int) -> int:
        own = self.phases[index].data
        return own.seq_len if own is not None and own.seq_len is not None else self.data.seq_len

    def phase_tokens_per_step(self) -> list[int]:
        return [self.batch_size * self.phase_seq_len(i) for i in range(len(self.phases))]

    def planned_tokens(self) -> int:
        """The tokens the run trains: each phase's steps x batch_size x its seq_len."""
        return sum(s * t for s, t in zip(self.phase_steps(), self.phase_tokens_per_step()))

    def phase_steps(self) -> list[int]:
        """Each phase's length in optimizer steps (a token count rounds up to whole steps). Fractions are cut
        at their cumulative boundaries, so any split of the budget trains ceil(budget_tokens / step) steps."""
        per_step = self.phase_tokens_per_step()
        if len(set(per_step)) > 1:
            return steps_by_length(self.phases, per_step, self.budget_tokens)
        out, done = [], 0.0
        for p in self.phases:
            if p.steps is not None:
                out.append(p.steps)
            elif p.tokens is not None:
                out.append(max(1, math.ceil(p.tokens / self.tokens_per_step)))
            else:
                start, done = self._steps_for(done * self.budget_tokens), done + p.fraction
                out.append(max(1, self._steps_for(done * self.budget_tokens) - start))
        return out

    def _steps_for(self, tokens: float) -> int:
        return math.ceil(tokens / self.tokens_per_step - 1e-9)  # 0.7 * 1000 is 700.0000000000001


def parse_layer_range(text: str) -> tuple[int, int] | None:
    """'0-7' -> (0, 7); '3' -> (3, 3); anything else -> None. Inclusive bounds."""
    parts = text.split("-")
    if len(parts) == 1 and parts[0].isdigit():
        return int(parts[0]), int(parts[0])
    if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit() and int(parts[0]) <= int(parts[1]):
        return int(parts[0]), int(parts[1])
    return None


def parse_run_spec(data: Any, file: str | None = None, prefix: str = "") -> RunSpec:
    return validate(RunSpec, data, file, "run spec", prefix)


def load_run_spec(path: str | Path) -> RunSpec:
    return parse_run_spec(read_yaml(path), file=str(path))


def dump_run_spec(spec: RunSpec) -> dict:
    return spec.model_dump(mode="json")
