"""The paths a GPU takes, run on the CPU: bf16 autocast (`precision: bf16`), torch.compile of the encoder
(`compile: true`) across phases that freeze different layers, and `deterministic: true`; and what these
fields do to run ids."""

from __future__ import annotations

import json

import pytest
import torch

from ablate.config.errors import SpecError
from ablate.config.spec import parse_run_spec
from ablate.models.loading import load_config
from ablate.train.loop import pretrain
from ablate.train.precision import uses_autocast, uses_compile
from builders import corpus_slice, run_spec


def _spec(model: str, **overrides) -> dict:
    spec = run_spec(
        model=model,
        device="cpu",
        data=corpus_slice(max_documents=150),
        checkpoint_every=100,
        log_every=1,
        phases=[
            {"name": "clm", "objective": "clm", "steps": 2, "freeze": ["embeddings", "low"]},
            {"name": "mlm", "objective": "mlm", "steps": 2, "freeze": "high"},
        ],
    )
    return {**spec, **overrides}


@pytest.fixture
def no_dropout_bert(tmp_path) -> str:
    """tiny-bert without dropout: a compiled run draws its dropout from inductor's generator, so only a model
    without dropout computes the same function compiled and eager."""
    config = load_config("config:tiny-bert").to_dict()
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    path = tmp_path / "tiny-bert-no-dropout.json"
    path.write_text(json.dumps(config))
    return f"config:{path}"


@pytest.fixture(autouse=True)
def _torch_defaults():
    """deterministic: true is process-wide in torch: leave the next test torch's defaults."""
    yield
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.deterministic = False


def _quiet(_msg: str) -> None:
    pass


def _snapshots():
    """A phase-end hook keeping each phase's final weights."""
    seen: dict[str, dict[str, torch.Tensor]] = {}

    def hook(phase: str, model: torch.nn.Module) -> list[dict]:
        seen[phase] = {n: p.detach().clone() for n, p in model.named_parameters()}
        return []

    return seen, hook


def _losses(state) -> list[float]:
    return [row["loss"] for row in state.curves]


# ---------------------------------------------------------------- the run id


def test_precision_is_in_the_run_id_once_written_and_the_other_switches_are_not():
    base = parse_run_spec(_spec("config:tiny-bert"))
    assert base.precision == "auto" and base.compile == "auto" and not base.deterministic
    bf16 = parse_run_spec(_spec("config:tiny-bert", precision="bf16"))
    fp32 = parse_run_spec(_spec("config:tiny-bert", precision="fp32"))
    assert len({base.run_id, bf16.run_id, fp32.run_id}) == 3
    assert len({base.training_identity, bf16.training_identity, fp32.training_identity}) == 3
    for how in (
        {"compile": True},
        {"compile": False},
        {"deterministic": True},
        {"compile": True, "deterministic": True},
    ):
        same = parse_run_spec(_spec("config:tiny-bert", **how))
        assert (same.run_id, same.training_identity) == (base.run_id, base.training_identity)


def test_compile_on_the_cpu_is_accepted_and_a_bad_precision_is_refused():
    assert parse_run_spec(_spec("config:tiny-bert", compile=True)).compile
    with pytest.raises(SpecError) as err:
        parse_run_spec(_spec("config:tiny-bert", precision="fp16"))
    assert err.value.key == "precision" and "bf16" in str(err.value) and "fp16" in str(err.value)


def test_auto_precision_is_bf16_on_cuda_and_fp32_on_the_cpu():
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    for precision, on_cpu, on_cuda in (("auto", False, True), ("bf16", True, True), ("fp32", False, False)):
        spec = parse_run_spec(_spec("config:tiny-bert", precision=precision))
        assert (uses_autocast(spec, cpu), uses_autocast(spec, cuda)) == (on_cpu, on_cuda)


def test_auto_compile_is_on_for_cuda_and_off_on_the_cpu(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    for compile_, on_cpu, on_cuda in (("auto", False, True), (True, True, True), (False, False, False)):
        spec = parse_run_spec(_spec("config:tiny-bert", compile=compile_))
        assert (uses_compile(spec, cpu), uses_compile(spec, cuda)) == (on_cpu, on_cuda)
    monkeypatch.setenv("ABLATE_COMPILE", "1")  # every run of the process
    assert uses_compile(parse_run_spec(_spec("config:tiny-bert", compile=False)), cpu)
    with pytest.raises(SpecError) as err:
        parse_run_spec(_spec("config:tiny-bert", compile="always"))
    assert err.value.key == "compile"


# ---------------------------------------------------------------- bf16 autocast on the CPU


def _watch_linear_dtypes(monkeypatch) -> set:
    """The output dtypes of the encoder's first Linear in the runs `pretrain` sets up from here on."""
    from ablate.train import loop

    dtypes: set[torch.dtype] = set()
    original = loop.setup

    def watched(spec, dist=None, log=print):
        ctx, tokenizer, plans = original(spec, dist, log)
        first = next(m for m in ctx.family.encoder(ctx.model).modules() if isinstance(m, torch.nn.Linear))
        first.register_forward_hook(lambda _m, _args, out: dtypes.add(out.dtype))
        return ctx, tokenizer, plans

    monkeypatch.setattr(loop, "setup", watched)
    return dtypes


@pytest.mark.slow
def test_bf16_on_the_cpu_runs_the_encoder_under_autocast_and_trains_close_to_fp32(
    tmp_path, data_root, no_dropout_bert, monkeypatch
):
    dtypes = _watch_linear_dtypes(monkeypatch)
    bf16 = pretrain(parse_run_spec(_spec(no_dropout_bert, precision="bf16")), tmp_path / "bf16", log=_quiet)
    assert dtypes == {torch.bfloat16}, "the bf16 run's matmuls did not run in bf16"
    dtypes.clear()
    fp32 = pretrain(parse_run_spec(_spec(no_dropout_bert, precision="fp32")), tmp_path / "fp32", log=_quiet)
    assert dtypes == {torch.float32}
    assert all(torch.isfinite(torch.tensor(_losses(bf16))))
    assert _losses(bf16) != _losses(fp32)
    # measured 2.5e-6 (a random init's loss is near ln(vocabulary) whatever the precision): 1e-3 is bf16's
    # rounding with room, and far below what a wrong mask dtype or a lost autocast region would change
    assert _losses(bf16) == pytest.approx(_losses(fp32), rel=1e-3)


# ---------------------------------------------------------------- torch.compile across freeze masks


def _frozen_by_phase(spec, model) -> dict[str, set[str]]:
    from ablate.models.families import family_of, n_layers
    from ablate.plan.freezing import is_frozen
    from ablate.plan.phases import plan_phases

    family = family_of(model.config)
    names = [n for n, _ in model.named_parameters()]
    return {
        p.name: {n for n in names if is_frozen(n, family, p.frozen)}
        for p in plan_phases(spec, n_layers(model.config))
    }


@pytest.mark.slow
def test_a_compiled_encoder_trains_exactly_the_layers_each_phase_unfreezes(tmp_path, data_root):
    """Phase clm freezes the embeddings and the low layers, phase mlm the high ones: under torch.compile
    every frozen weight stays bitwise where the phase found it, every other one moves (the layers frozen in
    clm train again in mlm), and the run computes what the eager run does. ModernBERT (no dropout in its
    tiny config) at 32 tokens runs its local layers (window 8) through the banded path, compiled. Its four
    block kinds cover the mechanism (requires_grad per phase, one graph per kind and state); the BERT block's
    single graph is tests/test_attention_kernels.py's."""
    from torch._dynamo.utils import counters

    from ablate.models.loading import load_masked_lm

    model = "config:tiny-modernbert"
    compiled_spec = parse_run_spec(_spec(model, compile=True))
    start = dict(load_masked_lm(compiled_spec.model, seed=compiled_spec.seed).named_parameters())
    frozen = _frozen_by_phase(compiled_spec, load_masked_lm(compiled_spec.model, seed=compiled_spec.seed))
    assert frozen["clm"] and frozen["mlm"] and frozen["clm"] != frozen["mlm"]

    counters.clear()
    seen, hook = _snapshots()
    lines: list[str] = []
    compiled = pretrain(compiled_spec, tmp_path / "compiled", log=lines.append, phase_end_hooks=(hook,))
    # one graph per block kind, frozen or not, input needing gradients or not (the first trained block after
    # frozen ones takes an input without) in each phase: the blocks share their graphs; each named in the
    # log; no eager fallback; the compiled code saved for the next process
    kinds = ["first", "local", "local", "global"]
    expected = 0
    for phase, names in frozen.items():
        states, grad_in = set(), not any(n.startswith("model.embeddings.") for n in names)
        for block, kind in enumerate(kinds):
            trained = not any(n.startswith(f"model.layers.{block}.") for n in names)
            states.add((kind, trained, grad_in))
            grad_in = grad_in or trained
        expected += len(states)
    assert sum("torch.compile: encoder block graph" in line for line in lines) == expected, lines
    assert not any("fell back to eager" in line for line in lines)
    assert list((tmp_path / "compiled" / "compile-cache").glob("*.torchcache"))

    before = {n: p.detach() for n, p in start.items()}
    for phase in ("clm", "mlm"):
        after = seen[phase]
        stayed = {n for n in after if torch.equal(after[n], before[n])}
        assert stayed == frozen[phase], (
            f"{phase}: moved while frozen {sorted(frozen[phase] - stayed)}, "
            f"did not train {sorted(stayed - frozen[phase])}"
        )
        before = after

    eager_seen, eager_hook = _snapshots()
    eager = pretrain(parse_run_spec(_spec(model)), tmp_path / "eager", log=_quiet, phase_end_hooks=(eager_hook,))
    assert _losses(compiled) == pytest.approx(_losses(eager), rel=1e-4)
    for name, weight in eager_seen["mlm"].items():
        torch.testing.assert_close(seen["mlm"][name], weight, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.slow
def test_a_compiled_encoder_names_its_eager_fallback_in_the_log(monkeypatch):
    """Past dynamo's recompile limit a block runs eager: the run's log says so (here with a limit of one
    graph, and four block kinds x bidirectional and causal)."""
    from ablate.models.families import family_of
    from ablate.models.loading import load_masked_lm
    from ablate.train.compiled import CompiledEncoder
    from ablate.train.attention_masks import attention_for

    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 1)
    torch._dynamo.reset()
    model = load_masked_lm("config:tiny-modernbert", seed=0)
    family = family_of(model.config)
    lines: list[str] = []
    encoder = CompiledEncoder(family.encoder(model), family, lines.append)
    ids = torch.randint(1000, 2000, (1, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), attention_for(model, family, "mlm", 32, torch.float32, "cpu") as attn:
        encoder(input_ids=ids, attention_mask=attn)
    assert encoder.graphs == 1 and encoder.fallbacks
    assert any(line.startswith("torch.compile fell back to eager: torch._dynamo hit") for line in lines), lines
    torch._dynamo.reset()


# ---------------------------------------------------------------- deterministic: true


def _watch_determinism(monkeypatch) -> list[bool]:
    """torch's deterministic-algorithms flag at every training step of the runs from here on."""
    from ablate.train import loop

    flags: list[bool] = []
    original = loop.train_step

    def watched(*args, **kwargs):
        flags.append(torch.are_deterministic_algorithms_enabled())
        return original(*args, **kwargs)

    monkeypatch.setattr(loop, "train_step", watched)
    return flags


@pytest.mark.slow
def test_deterministic_is_on_during_the_run_changes_nothing_on_the_cpu_and_resumes_bit_exactly(
    tmp_path, data_root, monkeypatch
):
    from safetensors.torch import load_file

    flags = _watch_determinism(monkeypatch)
    spec = parse_run_spec(_spec("config:tiny-bert", deterministic=True))
    whole = pretrain(spec, tmp_path / "whole", log=_quiet)
    assert flags == [True] * 4
    assert torch.backends.cudnn.deterministic

    flags.clear()
    pretrain(spec, tmp_path / "resumed", log=_quiet, stop_after_steps=3)
    resumed = pretrain(spec, tmp_path / "resumed", log=_quiet)
    assert flags == [True] * 4 and resumed.done
    assert _losses(resumed) == _losses(whole)
    a, b = (load_file(tmp_path / d / "model" / "model.safetensors") for d in ("whole", "resumed"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    flags.clear()
    default = pretrain(parse_run_spec(_spec("config:tiny-bert")), tmp_path / "default", log=_quiet)
    assert flags == [False] * 4, "a run without deterministic: true kept the previous run's switch"
    assert _losses(default) == _losses(whole), "on the CPU the switch changed a number"
