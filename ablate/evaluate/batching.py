"""Batches for fine-tuning: each epoch's order of batches (epoch_batches: shuffled, or grouped by length, drawn
from a torch.Generator so that the same seed gives the same batches), the length-sorted pieces one batch is run
in on the CPU (length_pieces, piece_overhead), and the tensors of a batch or piece, padded to its own longest example (collate; the labels'
tensors are the task type's: ablate.evaluate.task_types).

May import: evaluate (encoded, task_types).
"""

from __future__ import annotations

import torch

from ablate.evaluate.encoded import IGNORE, Encoded, pad_rows
from ablate.evaluate.task_types import task_type as type_entry

__all__ = ["IGNORE", "Encoded", "POOL_BATCHES", "epoch_batches", "length_pieces", "collate"]

# Examples are sorted by length within pools of this many batches (transformers' LengthGroupedSampler uses the
# same 50): enough to make padding rare, while which examples meet in a batch still depends on the shuffle.
POOL_BATCHES = 50


def epoch_batches(
    lengths: list[int], batch_size: int, generator: torch.Generator, by_length: bool = True
) -> list[list[int]]:
    """One epoch's batches of example indexes, every example once. A random permutation, cut into batches;
    by_length: cut into pools of POOL_BATCHES batches first, each pool sorted by length (stably) before it is
    cut, and the batches then shuffled, so that long and short batches alternate at random. As many batches
    as plain shuffling (only the last pool can end in a partial batch)."""
    order = torch.randperm(len(lengths), generator=generator).tolist()
    if not by_length:
        return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    pool = batch_size * POOL_BATCHES
    batches = []
    for start in range(0, len(order), pool):
        chunk = sorted(order[start : start + pool], key=lengths.__getitem__)
        batches += [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
    return [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]


# With finetune.length_pieces, on CPU a batch is run in length-sorted pieces (batching.length_pieces) wherever
# that saves more padding than the fixed cost of one more forward and backward pass, which is about this many
# tokens' worth (MiniLM-L6 on the 2-core dev machine: about 30 ms a pass, about 1 ms a token on one thread;
# the cut-off is flat between 32 and 64). On accelerators padding is almost free at fine-tuning sizes (and on
# CUDA each row's padding is left out of attention): a batch is one piece there.
PIECE_OVERHEAD_TOKENS = 48


def piece_overhead(device: torch.device | str, length_pieces: bool) -> int | None:
    """The overhead batching.length_pieces cuts a fine-tuning batch by: PIECE_OVERHEAD_TOKENS on the CPU when
    the settings ask for pieces, else None (one piece)."""
    return PIECE_OVERHEAD_TOKENS if length_pieces and torch.device(device).type == "cpu" else None


def length_pieces(lengths: list[int], overhead: int | None) -> list[list[int]]:
    """The positions of one batch's examples, cut into pieces to run one after the other (their gradients
    accumulate into the batch's): sorted by length, and cut where the padding it saves costs more than one more
    forward and backward pass, `overhead` in tokens. The cuts minimise the sum over pieces of
    (examples x longest + overhead). overhead None: one piece, in the batch's order."""
    if overhead is None:
        return [list(range(len(lengths)))]
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    cost, cut = [0] + [0] * len(order), [0] * (len(order) + 1)  # best cost of the first `end`, and its last cut
    for end in range(1, len(order) + 1):
        longest = lengths[order[end - 1]]
        cost[end], cut[end] = min((cost[s] + (end - s) * longest + overhead, s) for s in range(end))
    pieces, end = [], len(order)
    while end:
        pieces.append(order[cut[end] : end])
        end = cut[end]
    return pieces[::-1]


def collate(items: list[Encoded], pad_id: int, task_type: str, token_types: bool) -> dict[str, torch.Tensor]:
    """Model inputs and labels of one batch, padded to its longest example. token_types: pass token_type_ids
    (False for models that take none, e.g. DistilBERT saved with a BERT tokenizer)."""
    n = max(len(it.input_ids) for it in items)
    batch = {
        "input_ids": pad_rows([it.input_ids for it in items], pad_id, n),
        "attention_mask": pad_rows([[1] * len(it.input_ids) for it in items], 0, n),
    }
    if token_types and items[0].token_type_ids is not None:
        batch["token_type_ids"] = pad_rows([it.token_type_ids for it in items], 0, n)
    return {**batch, **type_entry(task_type).collate(items)}
