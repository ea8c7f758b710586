"""span_ner is the span model as the paper's harness runs it (github Rian-T/tabib, src/tabib/models/
bert_span_ner.py at 16649393, config configs/base/ner_span_bert.yaml): the BRAT reader (EMEA by lines, MEDLINE by
documents), one 45-tag CRF chain with tabib's transitions, the BiLSTM block, 11 columns and one label per span,
the loss (span BCE alone), the training spans (the first 500 negatives in order), tabib's entity sub-tokens and
whitespace stripping, the checkpoint rule (tabib's sampled-span dev score, or the decoded one as an option), span
F1, and the span model fine-tuned on a few QUAERO EMEA lines."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

import ablate.evaluate.finetune as ft
from ablate.config.errors import SpecError
from ablate.evaluate import metrics
from ablate.evaluate.brat import read_folder
from ablate.evaluate.crf import B, I, L, O, BIOULChainCRF, bioul_constraints, tag
from ablate.evaluate.span_model import PAD_LABEL, BiLSTMBlock, SpanNER
from ablate.evaluate.spans import drop_same_label_overlaps, entity_tokens, real_tokens, stripped, training_spans
from ablate.evaluate.task_types.span_ner import SampledCounts, SpanPrediction, SpanTargets, decode, sampled_span_f1
from ablate.evaluate.tasks import load_task, load_task_data, resolve_settings


def test_the_brat_reader_keeps_nested_entities(data_root):
    lines, counts = read_folder(Path(data_root) / "quaero_brat" / "train" / "EMEA")
    # 318.ann: T6 "principe actif" (CHEM 109-123) and T7 "ziconotide" (CHEM 124-134) are beside each other;
    # "douleurs intenses , chroniques" holds the DISO "douleurs": a nested pair.
    text, spans = next((t, s) for t, s in lines if "douleurs intenses" in t)
    outer = [(s, e, k) for s, e, k in spans if text[s:e].startswith("douleurs intenses")]
    inner = [(s, e, k) for s, e, k in spans if text[s:e] == "douleurs"]
    assert outer and inner and any(o[0] <= i[0] and i[1] <= o[1] for o in outer for i in inner)
    assert counts.entities == 2695 and counts.kept == 2695  # SOURCE.md's count of train EMEA T lines


def test_emea_examples_are_lines_and_medline_examples_are_documents(data_root):
    emea = load_task_data(load_task("quaero_emea_spans"), data_root).splits
    medline = load_task_data(load_task("quaero_medline_spans"), data_root).splits
    assert [len(emea[s]) for s in ("train", "dev", "test")] == [706, 649, 578]
    assert all("\n" not in ex.text and ex.text.strip() for ex in emea["train"])
    assert [len(medline[s]) for s in ("train", "dev", "test")] == [833, 832, 833]  # one a .txt file
    folder = Path(data_root) / "quaero_brat" / "train" / "MEDLINE"
    two_lines = (folder / "20873436.txt").read_text(encoding="utf-8")
    doc = next(ex for ex in medline["train"] if ex.text == two_lines)  # the whole file, newlines and all
    assert two_lines.strip().count("\n") == 1 and all(doc.text[s:e].strip() for s, e, _ in doc.label)
    # read by lines, the same folder gives one example more: the reading is the task file's data.units
    assert len(read_folder(folder, "lines")[0]) == 834 and len(read_folder(folder, "documents")[0]) == 833
    # and both draw their batches at random, as tabib's Trainer does
    assert not any(load_task(t).finetune.group_by_length for t in ("quaero_emea_spans", "quaero_medline_spans"))


def _tabib_constraints(num_labels: int):
    """tabib's BIOULDecoder(allow_overlap=True, allow_juxtaposition=True, with_start_end_transitions=True)
    forbidden transitions, transcribed from src/tabib/models/crf.py at 16649393: the allowed ones returned."""
    O, I, B, L, U = 0, 1, 2, 3, 4  # noqa: E741
    n = 1 + 4 * num_labels
    forbidden = torch.ones(n, n, dtype=torch.bool)
    forbidden[O, O] = False
    for i in range(num_labels):
        s = 4 * i
        for j in range(num_labels):
            sj = 4 * j
            forbidden[L + s, B + sj] = forbidden[L + s, U + sj] = False
            forbidden[U + s, B + sj] = forbidden[U + s, U + sj] = False
        for a, b in [(O, B + s), (B + s, I + s), (I + s, I + s), (I + s, L + s), (B + s, L + s), (L + s, O)]:
            forbidden[a, b] = False
        for a, b in [(O, U + s), (U + s, O), (L + s, I + s), (L + s, L + s), (I + s, B + s), (B + s, B + s)]:
            forbidden[a, b] = False
        for a, b in [(B + s, U + s), (U + s, L + s), (U + s, I + s), (I + s, U + s)]:
            forbidden[a, b] = False
    start, end = torch.zeros(n, dtype=torch.bool), torch.zeros(n, dtype=torch.bool)
    for i in range(num_labels):
        start[[I + 4 * i, L + 4 * i]] = True
        end[[I + 4 * i, B + 4 * i]] = True
    return ~forbidden, ~start, ~end


def test_the_tagger_is_one_chain_of_45_tags_with_tabibs_transitions():
    trans, start, end = bioul_constraints(11)
    assert trans.shape == (45, 45)
    for mine, tabib in zip((trans, start, end), _tabib_constraints(11)):
        assert torch.equal(mine, tabib)
    model = SpanNER(_tiny_encoder(), 10, 8, 1, 4, 5, 0.0)
    assert model.columns == 11 and model.tags.out_features == 45 and model.crf.n_tags == 45
    # spans of one column overlap (I -> B); spans of two columns only follow each other (L -> B), never O -> I
    assert trans[tag(0, I), tag(0, B)] and not trans[tag(0, I), tag(1, B)] and trans[tag(0, L), tag(1, B)]
    assert not trans[O, tag(3, I)] and not start[tag(2, L)] and not end[tag(2, B)] and end[O]


def _paths(n_tags: int, length: int):
    return itertools.product(range(n_tags), repeat=length)


@pytest.mark.parametrize("n_columns, length", [(1, 4), (2, 3)])
def test_the_crf_marginals_match_brute_force(n_columns, length):
    torch.manual_seed(0)
    crf = BIOULChainCRF(n_columns).double()
    with torch.no_grad():
        for p in (crf.transitions, crf.start, crf.end):
            p.normal_()
    n_tags = crf.n_tags
    emissions = torch.randn(2, length, n_tags, dtype=torch.float64)
    mask = torch.tensor([[True] * length, [True] * (length - 1) + [False]])
    trans, start, end = crf.scores()
    marginals = crf.marginals(emissions, mask).exp()
    for row in range(2):
        n = int(mask[row].sum())
        scores = {
            p: start[p[0]]
            + sum(emissions[row, t, p[t]] for t in range(n))
            + sum(trans[p[t - 1], p[t]] for t in range(1, n))
            + end[p[-1]]
            for p in _paths(n_tags, n)
        }
        log_z = torch.logsumexp(torch.stack(list(scores.values())), 0)
        for t in range(n):
            for k in range(n_tags):
                brute = sum((s - log_z).exp() for p, s in scores.items() if p[t] == k)
                assert torch.allclose(marginals[row, t, k], brute, atol=1e-9)


def _tiny_encoder():
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
    )
    return BertModel(config, add_pooling_layer=False)


def test_the_bilstm_block_is_a_projection_then_gated_residual_bilstms():
    block = BiLSTMBlock(16, 8, 3, dropout=0.0).eval()
    project = block.project
    assert isinstance(project, torch.nn.Linear) and (project.in_features, project.out_features) == (16, 8)
    assert [(m.num_layers, m.bidirectional, m.hidden_size) for m in block.lstms] == [(1, True, 4)] * 3
    assert [g.out_features for g in block.gates] == [1] * 3
    assert [n.normalized_shape for n in block.norms] == [(8,)] * 3
    x, mask = torch.randn(2, 5, 16), torch.ones(2, 5, dtype=torch.long)
    h = torch.nn.functional.gelu(block.project(x))
    for lstm, gate, norm in zip(block.lstms, block.gates, block.norms):
        out = lstm(h)[0]
        g = torch.sigmoid(gate(out))
        h = norm(h * (1 - g) + out * g)
    assert torch.allclose(block(x, mask), h, atol=1e-6)


def _batch():
    ids = torch.randint(5, 50, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 7:] = 0
    ids[1, 7:] = 0
    positives = torch.tensor([[[2, 3, 1], [4, 4, 2]], [[1, 2, 2], [0, 0, PAD_LABEL]]])
    return ids, mask, positives, torch.tensor([8, 6])


def test_the_loss_is_the_span_bce_alone_and_the_two_scores_add_up_in_the_span_logit():
    model = SpanNER(_tiny_encoder(), 2, 8, 1, 4, 5, 0.0)
    ids, mask, positives, stops = _batch()
    out = model(ids, mask, span_positives=positives, span_stops=stops)
    keep = out.sampled_labels != PAD_LABEL
    target = torch.nn.functional.one_hot(out.sampled_labels[keep], 3).float()
    bce = torch.nn.functional.binary_cross_entropy_with_logits(out.sampled[keep], target)
    assert torch.allclose(out.loss, bce)  # averaged over columns and spans: no CRF term beside it
    out.loss.backward()
    assert model.crf.transitions.grad.abs().sum() > 0  # the CRF learns through the span scores only

    model.eval()
    out = model(ids, mask, span_positives=positives, span_stops=stops)
    with torch.no_grad():
        context = model.block(model.encoder(input_ids=ids, attention_mask=mask).last_hidden_state, mask)
        marg = model.crf.marginals(model.tags(context), mask.bool())[0]  # row 0
        kinds = marg[:, 1:].view(9, 3, 4)  # I, B, L, U per column
        s, e = 2, 4
        tagger = torch.minimum(
            torch.minimum(
                kinds[s : e + 1].logsumexp(-1).sum(0).clamp(max=-1e-8), kinds[s, :, [1, 3]].logsumexp(-1)
            ),
            kinds[e, :, [2, 3]].logsumexp(-1),
        )
        begins, ends = model.begins(context[0]).view(9, 3, 4), model.ends(context[0]).view(9, 3, 4)
        biaffine = (begins[s] * ends[e]).sum(-1) / 2 + model.bias
    assert torch.allclose(out.logits[0, s, e - s], tagger + biaffine, atol=1e-5)  # 1:1
    assert out.logits.shape == (2, 9, 5, 3)  # 2 labels and the "O" column
    # spans tabib decodes: after [CLS], before each row's [SEP]
    assert out.valid[0, 1, 4] and out.valid[0, 7, 0] and not out.valid[0, 8, 0] and not out.valid[0, 4, 4]
    assert not out.valid[0, 0, 0] and out.valid[1, 5, 0] and not out.valid[1, 6, 0]


def test_the_negatives_are_the_first_500_in_order_and_an_example_keeps_512_spans():
    positives = [(2, 3, 1), (2, 3, 4), (7, 7, 2)]  # one span with two labels: two training spans
    spans = training_spans(positives, 1, 100, 40)
    order = [(s, e) for s in range(1, 100) for e in range(s, min(s + 40, 100)) if (s, e) not in {(2, 3), (7, 7)}]
    assert sorted(x for x in spans if x[2] > 0) == sorted(positives)
    assert sorted((s, e) for s, e, lab in spans if lab == 0) == sorted(order[:500])
    assert len(spans) == 503 and spans == training_spans(positives, 1, 100, 40)  # the same each pass
    many = [(s, s, 1) for s in range(1, 21)]  # 20 entities: 520 spans, cut to 512
    kept = training_spans(many, 1, 100, 40)
    negatives = [(s, e, 0) for s in range(1, 100) for e in range(s, min(s + 40, 100)) if e > s or s > 20]
    assert len(kept) == 512 and set(kept) <= set(many) | set(negatives[:500])
    assert training_spans([], 1, 1, 40) == [(1, 1, 0)]  # no sub-token: tabib's one placeholder


def test_an_entity_trains_as_tabibs_sub_tokens():
    text = "les dispositifs utérins"
    offsets = [(0, 0), (0, 3), (4, 15), (16, 22), (22, 23), (0, 0)]  # "utérin" "##s"
    first, stop = real_tokens(offsets)
    assert (first, stop) == (1, 5)
    assert entity_tokens(offsets, text, 4, 15, first, stop) == (2, 2)
    # tabib looks the end up at end - 2: a one-character last sub-token is left out
    assert entity_tokens(offsets, text, 16, 23, first, stop) == (3, 3)
    assert entity_tokens(offsets, text, 4, 23, first, stop) == (2, 3)
    overlapping = [(0, 0), (0, 3), (3, 4), (3, 15), (0, 0)]  # a "▁" piece over the word's first character
    assert entity_tokens(overlapping, "les▁dispositifs", 3, 15, 1, 4) == (3, 3)  # the longest sub-token
    assert entity_tokens(offsets, text, 16, 23, first, 3) is None  # cut off by max_length


class _Outputs:
    def __init__(self, logits, valid, sampled, sampled_labels, cls_span):
        self.logits, self.valid, self.sampled, self.sampled_labels = logits, valid, sampled, sampled_labels
        self.cls_span = cls_span


def test_decoding_gives_one_label_per_span_with_whitespace_stripped_offsets():
    text = "a bc de"
    offsets = [(0, 0), (0, 1), (1, 4), (4, 7), (0, 0)]  # a byte-level BPE's: " bc" holds the space before it
    item = ft.Encoded([1, 5, 6, 7, 2], None, SpanTargets((), 4), None, offsets)
    logits = torch.full((1, 5, 2, 3), -5.0)
    logits[0, 2, 0, 1:] = torch.tensor([2.0, 3.0])  # "bc": both labels over 0.5, the second higher
    logits[0, 2, 1, 1] = 1.0  # "bc de", label A, a lower score than "bc" as B: kept (another label)
    logits[0, 1, 1, 1] = 0.5  # "a bc", label A: overlaps "bc de" (A, higher): dropped
    valid = torch.ones(1, 5, 2, dtype=torch.bool)
    sampled = torch.tensor([[[0.0, 1.0, 0.0], [2.0, 0.0, 0.0], [0.0, 0.0, 1.0], [9.0, 9.0, 9.0]]])
    sampled_labels = torch.tensor([[1, 1, 0, PAD_LABEL]])
    outputs = _Outputs(logits, valid, sampled, sampled_labels, torch.tensor([[1.0, 0.0, 0.0]]))
    (pred,) = decode(outputs, [item], ("A", "B"), [ft.Example(text, ())])
    assert list(pred) == [(2, 4, "B"), (2, 7, "A")]
    # a hit, a non-entity taken for B, an entity missed, of 3 spans (padding left out); [CLS] takes column 0
    assert pred.sampled == (1, 1, 1, 3, False)
    other = SpanPrediction((), SampledCounts(1, 0, 0, 1, False))
    assert sampled_span_f1(None, [pred, other]) == pytest.approx(2 * 2 / (4 + 1 + 1))


def test_tabibs_dev_score_counts_the_padding_slots_of_its_batches_of_16():
    c = SampledCounts
    preds = [c(2, 1, 1, 10, False), c(1, 0, 0, 4, True)] + [c(0, 0, 0, 1, True)] * 14 + [c(1, 0, 0, 2, True)]
    # the first batch of 16 pads to 10 spans: 6 slots of the second example and 9 of each of the 14 after it
    # count as false positives ([CLS] takes an entity column there); the second batch, one example, pads none
    tp, fp, fn = 4, 1 + 6 + 14 * 9, 1
    got = sampled_span_f1(None, [SpanPrediction((), p) for p in preds])
    assert got == pytest.approx(2 * tp / (2 * tp + fp + fn))
    assert stripped(" bc ", 0, 4) == (1, 3) and stripped("  ", 0, 2) == (2, 2)


def test_the_overlap_filter_keeps_the_better_span_of_a_label_and_nests_across_labels():
    kept = drop_same_label_overlaps(
        [(0.9, 0, 10, "DISO"), (0.8, 5, 15, "DISO"), (0.7, 0, 4, "ANAT"), (0.6, 10, 12, "DISO")]
    )
    assert kept == [(0, 4, "ANAT"), (0, 10, "DISO"), (10, 12, "DISO")]
    # equal scores: the longer first, then the candidates' order (tabib's stable sort)
    assert drop_same_label_overlaps([(1.0, 0, 3, "A"), (1.0, 2, 8, "A"), (1.0, 1, 7, "A")]) == [(2, 8, "A")]


def test_span_f1_on_hand_cases():
    gold = [((0, 4, "A"), (0, 10, "B")), ((3, 5, "A"),)]
    pred = [((0, 4, "A"), (0, 9, "B")), ((3, 5, "A"), (6, 7, "A"))]
    assert metrics.span_precision(gold, pred) == 0.5 and metrics.span_recall(gold, pred) == 2 / 3
    assert metrics.span_f1(gold, pred) == pytest.approx(2 * 2 / (4 + 3))
    assert metrics.span_f1([()], [()]) == 0.0


SMALL = {
    "max_train_examples": 8,
    "max_eval_examples": 6,
    "max_steps": 4,
    "eval_every": 2,
    "batch_size": 4,
    "max_length": 32,
    "lstm_hidden_size": 32,
    "lstm_layers": 1,
    "biaffine_hidden_size": 8,
    "max_span_length": 8,
    "head_lr": 3e-3,
    "lr": 1e-3,
}


def test_the_span_model_trains_on_quaero_emea(tiny_bert, data_root):
    task = load_task("quaero_emea_spans")
    settings = resolve_settings(task, SMALL)
    losses = []
    seen = []
    rows = ft.finetune(
        tiny_bert,
        task,
        0,
        settings,
        data_root,
        progress=lambda p: losses.append(p["loss"]),
        on_predictions=lambda split, gold, pred: seen.append((split, gold, pred)),
    )
    again = ft.finetune(tiny_bert, task, 0, settings, data_root)
    scores = {(r["split"], r["metric"]): r["value"] for r in rows}
    assert set(scores) == {(s, m) for s in ("dev", "test") for m in task.metrics}
    assert [r["value"] for r in rows] == [r["value"] for r in again]  # deterministic by seed
    assert losses[-1] < losses[0]
    split, gold, pred = seen[1]
    assert split == "test" and len(gold) == len(pred) == 6
    assert any(
        len({(s, e) for s, e, _ in g}) < len(g)
        or any(a[0] <= b[0] and b[1] <= a[1] and a != b for a in g for b in g)
        for g in gold
    )  # nested gold spans are scored as they are
    assert all(isinstance(p, tuple) for p in pred)


@pytest.mark.parametrize("selection, kept", [("sampled", 1), ("decoded", 2)])
def test_the_checkpoint_is_kept_by_tabibs_sampled_span_score_unless_decoded_is_asked(
    tiny_bert, data_root, monkeypatch, selection, kept
):
    """Two dev evaluations, the first better by the sampled spans, the second by the decoded predictions."""
    task = load_task("quaero_emea_spans")
    settings = resolve_settings(task, {**SMALL, "max_steps": 2, "eval_every": 1, "span_selection": selection})
    scripted = iter([{"span_f1": 0.1, "sampled_span_f1": 0.9}, {"span_f1": 0.5, "sampled_span_f1": 0.2}])
    real = ft.compute

    def compute(type_name, names, gold, pred, negative_label=None):  # the two dev evaluations, then test
        scores = real(type_name, names, gold, pred, negative_label)
        return {**scores, **{k: v for k, v in next(scripted, {}).items() if k in names}}

    monkeypatch.setattr(ft, "compute", compute)
    rows = ft.finetune(tiny_bert, task, 0, settings, data_root)
    assert {r["epoch"] for r in rows} == {kept}
    assert {r["metric"] for r in rows} == set(task.metrics)  # the sampled score picks; it is not reported
    assert task.entry.selection(settings) == ("sampled_span_f1" if selection == "sampled" else None)


def test_a_span_ner_split_without_brat_files_says_what_it_expects(tmp_path):
    import yaml

    from ablate.evaluate.tasks import tasks_dir

    for split in ("train", "dev", "test"):
        (tmp_path / split).mkdir()
        (tmp_path / split / "a.tsv").write_text("word\tO\n")
    spec = yaml.safe_load((tasks_dir() / "quaero_emea_spans.yaml").read_text())
    spec["data"]["splits"] = {s: s for s in ("train", "dev", "test")}
    path = tmp_path / "quaero_emea_spans.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(SpecError) as e:
        load_task_data(load_task(str(path)), tmp_path)
    err = e.value
    assert "no BRAT .txt/.ann pairs" in err.message and err.file == str(path)
    assert (err.key, err.value) == ("data.splits.train", "train") and "<doc>.ann" in err.allowed
    spec.update(type="token_classification", columns={"text": 0, "label": 1}, metrics=["entity_f1"], finetune={})
    spec["data"] = {"format": "conll", "units": "lines", "splits": spec["data"]["splits"]}
    del spec["labels"]
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(SpecError) as e:
        load_task(str(path))
    assert (e.value.key, e.value.value) == ("data.units", "lines") and "brat" in e.value.allowed


def test_span_scores_are_not_older_span_model_scores_and_other_tasks_keep_their_identity():
    from ablate.evaluate.identity import _NOT_COMPUTATION, _digest, settings_hash, task_hash

    ncbi, quaero = load_task("ncbi_disease"), load_task("quaero_emea_spans")
    before = ncbi.model_dump(mode="json", exclude={*_NOT_COMPUTATION, "group_by"})
    del before["data"]["units"]
    assert task_hash(ncbi) == _digest(before)  # a task without data.units hashes as before it existed
    # the span model's revision enters a span_ner task's identity: scores of ablate's former model recompute
    assert task_hash(quaero) != _digest(quaero.model_dump(mode="json", exclude={*_NOT_COMPUTATION, "group_by"}))
    settings = resolve_settings(quaero)
    assert settings_hash(settings) != settings_hash(settings.model_copy(update={"span_selection": "decoded"}))


@pytest.mark.parametrize(
    "task, value, says",
    [
        ("quaero_emea_spans", "best", "sampled"),
        ("ncbi_disease", "decoded", "never"),
        ("quaero_emea_spans", 3, "sampled"),
    ],
)
def test_span_selection_is_checked_like_every_setting(tmp_path, task, value, says):
    import yaml

    from ablate.cli import main
    from ablate.evaluate.tasks import tasks_dir

    spec = yaml.safe_load((tasks_dir() / f"{task}.yaml").read_text())
    spec["finetune"]["span_selection"] = value
    path = tmp_path / f"{task}.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(SpecError) as e:
        load_task(str(path))
    assert e.value.key == "finetune.span_selection" and e.value.file == str(path)
    assert says in f"{e.value.message} {e.value.allowed}"
    assert main(["evaluate", str(tmp_path / "none"), "--task", str(path)]) == 2
