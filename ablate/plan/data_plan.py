"""What a run reads of each corpus when it reads by members (a mixture, or phases with data of their own):
tokens per source per phase, epochs per source, and the refusal of a source read more than data.max_epochs
times by its share (plan.epochs does the same for a run of one corpus).

A source's epochs add up over the sequence lengths it is read at: each stream (a corpus at one length) reads
its planned sequences out of corpus tokens // seq_len packed ones.

May import: config, data, plan.
"""

from __future__ import annotations

import math

from ablate.config.errors import SpecError
from ablate.config.spec import RunSpec
from ablate.data.mixture import planned_member_sequences
from ablate.plan.epochs import GRID_KEY, OVER, format_epochs


def source_tokens(spec: RunSpec) -> list[dict]:
    """One row per (phase, source): the sequences and tokens the plan reads from it."""
    rows = []
    for phase, (data, counts) in zip(spec.phases, planned_member_sequences(spec)):
        for member, count in zip(data.members, counts):
            rows.append(
                {
                    "phase": phase.name,
                    "source": member.label,
                    "seq_len": data.seq_len,
                    "sequences": int(count),
                    "tokens": int(count) * data.seq_len,
                }
            )
    return rows


def source_epochs(spec: RunSpec, corpus_tokens: dict[str, int]) -> dict[str, float]:
    """How many times the run reads each source (inf when it packs no sequence at a length it is read at)."""
    out: dict[str, float] = {}
    for row in source_tokens(spec):
        packed = corpus_tokens[row["source"]] // row["seq_len"]
        share = row["sequences"] / packed if packed else (math.inf if row["sequences"] else 0.0)
        out[row["source"]] = out.get(row["source"], 0.0) + share
    return out


def source_refusals(spec: RunSpec, corpus_tokens: dict[str, int]) -> list[str]:
    """The sources a submission refuses: read more than max_epochs times, or packing fewer sequences than a batch."""
    bad = [s for s, e in source_epochs(spec, corpus_tokens).items() if e > spec.data.max_epochs * (1 + 1e-12)]
    for row in source_tokens(spec):
        if row["sequences"] and corpus_tokens[row["source"]] // row["seq_len"] < spec.batch_size:
            bad.append(row["source"])
    return list(dict.fromkeys(bad))


def check_source_epochs(spec: RunSpec, corpus_tokens: dict[str, int], file: str | None = None) -> None:
    """A SpecError naming the first source the run would read more than data.max_epochs times by its share,
    or whose packed sequences are fewer than a global batch."""
    epochs = source_epochs(spec, corpus_tokens)
    for row in source_tokens(spec):
        source, packed = row["source"], corpus_tokens[row["source"]] // row["seq_len"]
        if row["sequences"] and packed < spec.batch_size:
            raise SpecError(
                f"source {source} packs {packed:,} sequences of {row['seq_len']} in phase "
                f"{row['phase']}: fewer than a global batch of {spec.batch_size} (run {spec.run_id})",
                file=file,
                key="batch_size",
                value=spec.batch_size,
                allowed=f"at most {packed:,} sequences, or a larger corpus",
            )
    for source, e in epochs.items():
        if e > spec.data.max_epochs * (1 + 1e-12):
            planned = sum(r["tokens"] for r in source_tokens(spec) if r["source"] == source)
            raise SpecError(
                f"source {source} has {corpus_tokens[source]:,} tokens; run {spec.run_id} plans "
                f"{planned:,} tokens from it by its share, {format_epochs(e)} epochs over it, more "
                f"than data.max_epochs allows: supply more text, lower its weight, shorten the run, "
                f"or allow repetition with data.max_epochs (in a grid: {GRID_KEY})",
                file=file,
                key="data.max_epochs",
                value=spec.data.max_epochs,
                allowed=f"at least {e:.4g} for this run and source",
            )


def source_epochs_cell(spec: RunSpec, sizes: dict) -> str:
    """The dry run's epochs cell of a run that reads by members: its most-read source's epochs (`!` when a
    submission refuses the run); `missing` or `unknown` when a source's tokens are not known."""
    if any(size.missing for size in sizes.values()):
        return "missing"
    if any(size.tokens is None for size in sizes.values()):
        return "unknown"
    tokens = {k: v.tokens for k, v in sizes.items()}
    epochs = source_epochs(spec, tokens)
    exact = all(size.exact for size in sizes.values())
    text = format_epochs(max(epochs.values()), estimate=not exact)
    return (text if exact else f"~{text} (estimate)") + (OVER if source_refusals(spec, tokens) else "")


def plan_lines(spec: RunSpec, corpus_tokens: dict[str, int | None], name: str) -> list[str]:
    """The dry run's lines of one run: tokens per source per phase, and each source's epochs (`!` refused)."""
    lines = [f"data of {name} ({spec.run_id}): tokens per source per phase"]
    for row in source_tokens(spec):
        lines.append(
            f"  {row['phase']}: {row['source']} {row['tokens']:,} tokens ({row['sequences']:,} sequences "
            f"of {row['seq_len']})"
        )
    if all(corpus_tokens.get(s) is not None for s in {r["source"] for r in source_tokens(spec)}):
        known = {k: v for k, v in corpus_tokens.items() if v is not None}
        refused = set(source_refusals(spec, known))
        for source, e in source_epochs(spec, known).items():
            lines.append(f"  {source}: {format_epochs(e)} epochs{OVER if source in refused else ''}")
    return lines
