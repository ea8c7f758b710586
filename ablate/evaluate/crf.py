"""A linear-chain CRF over BIOUL tags, batched over sequences: log-partition (forward algorithm), the negative
log-likelihood of gold tags, and each position's tag marginals (forward-backward), with the transitions BIOUL
forbids held at a large negative score (O->I, B->O, ...; a sequence starts with O, B or U and ends with O, L or U).

Written here rather than taken from pytorch-crf (0.7.2): that library has the log-likelihood and Viterbi, but
neither transition constraints nor marginals, which the span model's boundary scores read.

May import: evaluate (spans).
"""

from __future__ import annotations

import torch

from ablate.evaluate.spans import B, I, L, O, U

FORBIDDEN = -1e4
_NEXT = {O: (O, B, U), B: (I, L), I: (I, L), L: (O, B, U), U: (O, B, U)}


def bioul_constraints() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(transitions 5x5, start 5, end 5) of 0 where BIOUL allows it and FORBIDDEN elsewhere."""
    trans = torch.full((5, 5), FORBIDDEN)
    for prev, nexts in _NEXT.items():
        trans[prev, list(nexts)] = 0.0
    start, end = torch.full((5,), FORBIDDEN), torch.full((5,), FORBIDDEN)
    start[[O, B, U]] = 0.0
    end[[O, L, U]] = 0.0
    return trans, start, end


class BIOULCRF(torch.nn.Module):
    """Learned transition scores plus the BIOUL constraints. Inputs: emissions (n, length, 5) and a mask
    (n, length) that keeps a prefix of each sequence (at least its first position)."""

    def __init__(self):
        super().__init__()
        self.transitions = torch.nn.Parameter(torch.zeros(5, 5))
        self.start = torch.nn.Parameter(torch.zeros(5))
        self.end = torch.nn.Parameter(torch.zeros(5))
        for name, value in zip(("c_trans", "c_start", "c_end"), bioul_constraints()):
            self.register_buffer(name, value, persistent=False)

    def _scores(self):
        return self.transitions + self.c_trans, self.start + self.c_start, self.end + self.c_end

    def _alphas(self, emissions: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
        trans, start, _ = self._scores()
        alpha = start + emissions[:, 0]
        alphas = [alpha]
        for t in range(1, emissions.shape[1]):
            step = torch.logsumexp(alpha.unsqueeze(2) + trans + emissions[:, t].unsqueeze(1), dim=1)
            alpha = torch.where(mask[:, t : t + 1], step, alpha)
            alphas.append(alpha)
        return alphas

    def log_partition(self, emissions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.logsumexp(self._alphas(emissions, mask)[-1] + self._scores()[2], dim=-1)

    def score(self, emissions: torch.Tensor, tags: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The unnormalised score of each sequence's tags."""
        trans, start, end = self._scores()
        keep = mask.to(emissions.dtype)
        emit = emissions.gather(2, tags.unsqueeze(2)).squeeze(2)
        total = start[tags[:, 0]] + (emit * keep).sum(1)
        total = total + (trans[tags[:, :-1], tags[:, 1:]] * keep[:, 1:]).sum(1)
        last = tags.gather(1, (mask.sum(1, keepdim=True) - 1).clamp(min=0)).squeeze(1)
        return total + end[last]

    def nll(self, emissions: torch.Tensor, tags: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """-log p(tags) of each sequence."""
        return self.log_partition(emissions, mask) - self.score(emissions, tags, mask)

    def marginals(self, emissions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """log p(tag at position t) (n, length, 5); positions the mask drops are left as they come out."""
        return self.marginals_and_partition(emissions, mask)[0]

    def marginals_and_partition(self, emissions: torch.Tensor, mask: torch.Tensor):
        """(marginals, log-partition) from one forward pass (the span model's loss reads both)."""
        trans, _, end = self._scores()
        alphas = self._alphas(emissions, mask)
        log_z = torch.logsumexp(alphas[-1] + end, dim=-1)
        beta = end.expand_as(alphas[-1])
        betas = [beta]
        for t in range(emissions.shape[1] - 2, -1, -1):
            step = torch.logsumexp(trans + (emissions[:, t + 1] + beta).unsqueeze(1), dim=2)
            beta = torch.where(mask[:, t + 1 : t + 2], step, end.expand_as(step))
            betas.append(beta)
        return torch.stack(alphas, 1) + torch.stack(betas[::-1], 1) - log_z[:, None, None], log_z
