"""The FLOPs of a pretraining step, counted from the model's config: nominal (the convention MFU figures
quote) and executed (what ablate's step computes).

    nominal  = 6 N + 12 x sum over layers of context x hidden      per token
    executed = 6 N_encoder                                         the blocks' matmuls, every token
             + 14 x hidden x allowed pairs / tokens, summed over layers   attention
             + 6 (hidden^2 + vocabulary x hidden) x labelled / tokens     the head, at labelled positions only

N: the parameters a token's matmuls use (all but the input embedding table; a tied decoder counts once);
context: the sequence length on a global layer, window + 1 on a local one (ModernBERT's report counts this
way: the nominal figure takes neither causality nor documents into account, and the head at every
position). Executed attention counts the (query, key) pairs the layer's mask allows, per the kernel
convention torch's FlopCounterMode uses (forward: QK^T and PV, 4 x hidden per pair; backward 2.5 times the
forward, the scores recomputed): flash kernels skip the tiles outside the mask, so this is what they compute up to the partial tiles
on the mask's edges. The head's transform and vocabulary projection run at labelled positions only (sparse
prediction: MLM's masked fraction, CLM's every position but a document's last).

tests/test_flops.py checks the matmuls and the head against FlopCounterMode on the meta device, and the pair
counts against dense masks; bench/gpu_check.py prints both figures per row.

Pure arithmetic over a model config and its family entry.

May import: config, models.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ablate.config.errors import SpecError
from ablate.models.families import family_of

FORWARD_AND_BACKWARD = 3  # a linear layer's backward is twice its forward's matmuls
ATTENTION_PASSES = 3.5  # flash attention's backward recomputes the scores: 5 matmuls to the forward's 2


@dataclass(frozen=True)
class StepFlops:
    """FLOPs of one training step over `tokens` tokens, by part."""

    tokens: int
    matmuls: float  # the blocks' linear layers, forward and backward
    attention: float  # scores and values over the allowed pairs
    head: float  # transform + vocabulary projection at labelled positions
    nominal: float  # the convention: 6 N + 12 context x hidden, per token, x tokens

    @property
    def executed(self) -> float:
        return self.matmuls + self.attention + self.head

    def per_token(self) -> dict[str, float]:
        return {
            "executed": self.executed / self.tokens,
            "nominal": self.nominal / self.tokens,
            "attention": self.attention / self.tokens,
            "head": self.head / self.tokens,
        }


def layer_windows(config) -> list[int | None]:
    """Per layer, its sliding window (|q - k| <= window), or None for a global layer."""
    types = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
    window = getattr(config, "sliding_window", None)
    return [window if t == "sliding_attention" else None for t in types]


def allowed_pairs(lengths: Sequence[int], causal: bool, window: int | None) -> int:
    """(query, key) pairs attention may score in segments of these lengths (documents, or whole rows), each
    on its own: all of them, causal (k <= q), within a window (|q - k| <= window), or both."""
    total = 0
    for n in lengths:
        if window is None or window >= n - 1:
            total += n * (n + 1) // 2 if causal else n * n
            continue
        w = window
        # causal: query q sees min(q, w) + 1 keys; bidirectional: that plus min(n - 1 - q, w) after it
        before = sum(min(q, w) + 1 for q in range(min(n, w))) + max(n - w, 0) * (w + 1)
        total += before if causal else 2 * before - n
    return total


def matmul_parameters(config) -> tuple[int, int]:
    """(the blocks' matmul weights, the head's: transform (hidden^2) + vocabulary projection) of a
    ModernBERT- or BERT-like config: attention's q, k, v and output (4 hidden^2), the MLP (the family entry's
    mlp_matrices x hidden x intermediate: 3 for a GLU, else 2), per layer."""
    hidden, inter = config.hidden_size, config.intermediate_size
    try:
        matrices = family_of(config).mlp_matrices
    except SpecError:  # no family entry: a plain MLP
        matrices = 2
    per_layer = 4 * hidden * hidden + matrices * hidden * inter
    return per_layer * config.num_hidden_layers, hidden * hidden + config.vocab_size * hidden


def step_flops(
    config,
    seq_len: int,
    rows: int,
    causal: bool,
    labelled: int,
    documents: Sequence[Sequence[int]] | None = None,
) -> StepFlops:
    """A step over `rows` sequences of `seq_len`: causal or bidirectional attention, `labelled` positions with
    a loss, and, with document masking, each row's document lengths (attention inside each)."""
    tokens = rows * seq_len
    blocks, head = matmul_parameters(config)
    segments = [list(row) for row in documents] if documents is not None else [[seq_len]] * rows
    attention = 0.0
    for window in layer_windows(config):
        pairs = sum(allowed_pairs(row, causal, window) for row in segments)
        attention += ATTENTION_PASSES * 4 * config.hidden_size * pairs
    context = sum(seq_len if w is None else min(seq_len, 2 * w + 1) for w in layer_windows(config))
    nominal = tokens * (6 * (blocks + head) + 12 * context * config.hidden_size)
    return StepFlops(tokens, 2 * FORWARD_AND_BACKWARD * blocks * tokens, attention, 6 * head * labelled, nominal)
