"""One linear-chain CRF over the BIOUL tags of every output column at once, as tabib's span model has it
(github Rian-T/tabib, src/tabib/models/crf.py `BIOULDecoder` at 16649393, after nlstruct, with
allow_overlap and allow_juxtaposition on, start and end transitions learned): tag 0 is O and column c has I, B,
L, U at 1 + 4c .. 4 + 4c, so 11 columns (an "O" column and 10 labels) make 45 tags. Allowed: O -> O, B, U;
B -> I, L of its column; I -> I, L; L, U -> O and -> B, U of any column; and, for overlaps within a column,
L -> I, L; I -> B, U; B -> B, U; U -> I, L. A sequence does not start on I or L, nor end on I or B. The
forbidden transitions are held at a large negative score; the learned ones start at 0.

The span model reads its marginals (forward-backward) as boundary scores and trains it through them only:
there is no negative log-likelihood of gold tags. Written here rather than taken from pytorch-crf (0.7.2):
that library has neither transition constraints nor marginals.

May import: nothing of ablate.
"""

from __future__ import annotations

import torch

FORBIDDEN = -1e5  # tabib's IMPOSSIBLE
O = 0
I, B, L, U = range(4)  # a tag's kind within its column: the tag is 1 + 4 * column + kind


def tag(column: int, kind: int) -> int:
    return 1 + 4 * column + kind


def bioul_constraints(n_columns: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(transitions, start, end) allowed, as booleans (n_tags x n_tags, n_tags, n_tags)."""
    n = 1 + 4 * n_columns
    trans = torch.zeros(n, n, dtype=torch.bool)
    trans[O, O] = True
    for c in range(n_columns):
        for kind in (B, U):
            trans[O, tag(c, kind)] = True
        for prev in (L, U):
            trans[tag(c, prev), O] = True
            for d in range(n_columns):
                trans[tag(c, prev), tag(d, B)] = trans[tag(c, prev), tag(d, U)] = True
        within = [(B, I), (B, L), (I, I), (I, L)]  # a span's inside
        within += [(L, I), (L, L), (I, B), (B, B), (B, U), (U, L), (U, I), (I, U)]  # overlapping ones
        for prev, nxt in within:
            trans[tag(c, prev), tag(c, nxt)] = True
    start, end = torch.ones(n, dtype=torch.bool), torch.ones(n, dtype=torch.bool)
    for c in range(n_columns):
        start[[tag(c, I), tag(c, L)]] = False
        end[[tag(c, I), tag(c, B)]] = False
    return trans, start, end


class BIOULChainCRF(torch.nn.Module):
    """Learned transition, start and end scores under the constraints of bioul_constraints(n_columns).
    Inputs: emissions (n, length, n_tags) and a mask (n, length) that keeps a prefix of each sequence (at least
    its first position)."""

    def __init__(self, n_columns: int, precision: str = "float32"):
        """precision: "float32", the forward-backward in float32 whatever the emissions' dtype (ablate's);
        "emissions", the transitions cast to the emissions' dtype (bf16 under autocast), as tabib casts them."""
        super().__init__()
        self.precision = precision
        trans, start, end = bioul_constraints(n_columns)
        self.n_tags = trans.shape[0]
        self.transitions = torch.nn.Parameter(torch.zeros(self.n_tags, self.n_tags))
        self.start = torch.nn.Parameter(torch.zeros(self.n_tags))
        self.end = torch.nn.Parameter(torch.zeros(self.n_tags))
        for name, allowed in zip(("allowed_trans", "allowed_start", "allowed_end"), (trans, start, end)):
            self.register_buffer(name, allowed, persistent=False)

    def scores(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(transitions, start, end) with the forbidden ones at FORBIDDEN."""
        return tuple(
            p.masked_fill(~allowed, FORBIDDEN)
            for p, allowed in (
                (self.transitions, self.allowed_trans),
                (self.start, self.allowed_start),
                (self.end, self.allowed_end),
            )
        )

    def marginals(self, emissions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """log p(tag at position t) (n, length, n_tags) over the masked prefix; positions the mask drops are
        left as they come out."""
        trans, start, end = self.scores()
        if self.precision == "float32":
            emissions = emissions.float()
        else:  # tabib's: the transitions in the emissions' dtype
            trans, start, end = (s.to(emissions.dtype) for s in (trans, start, end))
        alpha = start + emissions[:, 0]
        alphas = [alpha]
        for t in range(1, emissions.shape[1]):
            step = torch.logsumexp(alpha.unsqueeze(2) + trans + emissions[:, t].unsqueeze(1), dim=1)
            alpha = torch.where(mask[:, t : t + 1], step, alpha)
            alphas.append(alpha)
        log_z = torch.logsumexp(alphas[-1] + end, dim=-1)
        beta = end.expand_as(alphas[-1])
        betas = [beta]
        for t in range(emissions.shape[1] - 2, -1, -1):
            step = torch.logsumexp(trans + (emissions[:, t + 1] + beta).unsqueeze(1), dim=2)
            beta = torch.where(mask[:, t + 1 : t + 2], step, end.expand_as(step))
            betas.append(beta)
        return torch.stack(alphas, 1) + torch.stack(betas[::-1], 1) - log_z[:, None, None]
