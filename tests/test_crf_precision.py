"""The span model's CRF precision (finetune.crf_precision): ablate's float32 forward-backward by default, or
tabib's, the transitions cast to the emissions' dtype (bf16 under autocast), which moves the marginals."""

import torch

from ablate.evaluate.crf import BIOULChainCRF
from ablate.evaluate.tasks import FinetuneSettings


def test_the_crf_runs_in_float32_or_in_the_emissions_dtype():
    torch.manual_seed(0)
    crf = BIOULChainCRF(3)
    with torch.no_grad():
        crf.transitions.normal_()
    emissions = torch.randn(2, 12, crf.n_tags).to(torch.bfloat16)
    mask = torch.ones(2, 12, dtype=torch.bool)
    ours = crf.marginals(emissions, mask)
    crf.precision = "emissions"
    tabib = crf.marginals(emissions, mask)
    assert ours.dtype == torch.float32 and tabib.dtype == torch.bfloat16
    # each position's tag probabilities sum to 1 in float32; bf16's forward-backward drifts from it
    assert torch.allclose(ours.exp().sum(-1), torch.ones(2, 12), atol=1e-4)
    assert (tabib.float().exp().sum(-1) - 1).abs().max() > 1e-2
    assert FinetuneSettings().crf_precision == "float32"
