"""BioClinical-ModernBERT's evaluation harness, the few functions ablate's English half is held against, kept as
they run there so that tests compare ablate with the harness's own logic, not with a re-reading of it.

Source: github lindvalllab/BioClinical-ModernBERT at fb40fb6 (MIT License, Copyright (c) 2025 lindvalllab):
- src/dataloader/dataloader.py: DEID.load_records, DEID.process_record, DEID.map_mask (lines 226-375),
  COS.process_ann_only (392-466), COS's and SocialHistory's file walk (468-481, 586-601), SocialHistory.parse_ann_file
  and process_pair (537-584): the bodies below are those lines with `self` dropped and the caching left out;
- src/tasks/token_classification.py:36-73, tokenize_and_align_labels (the tokenizer passed in);
- src/metrics/metrics.py:43-75, compute_metrics_token_classification, with `evaluate.load("seqeval")` replaced by
  what that metric computes (github huggingface/evaluate, metrics/seqeval/seqeval.py, `_compute`: seqeval's
  classification_report with its default mode, overall_* from its "micro avg"): `evaluate.load` fetches the
  metric's script from the Hugging Face hub, which tests cannot reach.
Not ablate's code: nothing in ablate/ imports this module.
"""

from __future__ import annotations

import os
import re

import numpy as np
from seqeval.metrics import accuracy_score, classification_report

# ------------------------------------------------------------------------------ src/metrics/metrics.py


def evaluate_seqeval(predictions, references) -> dict:
    """evaluate's seqeval metric with its default config (suffix False, scheme None, mode None, zero_division
    "warn"): its overall_* scores."""
    report = classification_report(
        y_true=references,
        y_pred=predictions,
        suffix=False,
        output_dict=True,
        scheme=None,
        mode=None,
        sample_weight=None,
        zero_division="warn",
    )
    overall = report.pop("micro avg")
    return {
        "overall_precision": overall["precision"],
        "overall_recall": overall["recall"],
        "overall_f1": overall["f1-score"],
        "overall_accuracy": accuracy_score(y_true=references, y_pred=predictions),
    }


def compute_metrics_token_classification(eval_pred, id2label) -> dict:
    predictions, labels = eval_pred
    predictions = np.argmax(predictions, axis=2)
    true_predictions = []
    true_labels = []
    for pred, label in zip(predictions, labels):
        pred_labels = []
        gold_labels = []
        for p, l in zip(pred, label):  # noqa: E741 (the harness's name)
            if l != -100:
                pred_labels.append(id2label[p])
                gold_labels.append(id2label[l])
        true_predictions.append(pred_labels)
        true_labels.append(gold_labels)
    results = evaluate_seqeval(predictions=true_predictions, references=true_labels)
    return {
        "precision": results["overall_precision"],
        "recall": results["overall_recall"],
        "f1": results["overall_f1"],
        "accuracy": results["overall_accuracy"],
    }


# --------------------------------------------------------------------- src/tasks/token_classification.py


def tokenize_and_align_labels(tokenizer, max_length: int, examples: dict) -> dict:
    tokenized_inputs = tokenizer(
        examples["tokens"], truncation=True, is_split_into_words=True, max_length=max_length
    )
    all_labels = []
    for i, labels in enumerate(examples["ner_tags"]):
        word_ids = tokenized_inputs.word_ids(batch_index=i)
        previous_word_idx = None
        label_ids = []
        for word_idx in word_ids:
            if word_idx is None:
                label_ids.append(-100)
            elif word_idx != previous_word_idx:
                label_ids.append(labels[word_idx])
            else:
                label_ids.append(-100)
            previous_word_idx = word_idx
        all_labels.append(label_ids)
    tokenized_inputs["labels"] = all_labels
    return tokenized_inputs


# ------------------------------------------------------------------------ src/dataloader/dataloader.py: DEID


def deid_load_records(filename: str) -> list[str]:
    with open(filename, "r", encoding="utf-8") as f:
        content = f.read()
    pattern = r"(START_OF_RECORD=.*?\|\|\|\|END_OF_RECORD)"
    return re.findall(pattern, content, flags=re.DOTALL)


def deid_map_mask(mask: str):
    content = mask[3:-3].strip()
    lower_content = content.lower()
    if "name" in lower_content:
        return "name"
    if "e-mail address" in lower_content or "email address" in lower_content:
        return "other"
    if "telephone/fax" in lower_content or "pager number" in lower_content:
        return "phone_nb"
    if "age over" in lower_content:
        return "age"
    if "location" in lower_content:
        return "location"
    for keyword in ["hospital", "street address", "unit number"]:
        if keyword in lower_content:
            return "location"
    if (
        re.fullmatch(r"\d+", content)
        or re.fullmatch(r"\d{1,2}-\d{1,2}", content)
        or re.fullmatch(r"\d{4}", content)
        or re.fullmatch(r"\d{4}-\d{2}-\d{2}", content)
        or "date range" in lower_content
        or "month/year" in lower_content
    ):
        return "date"
    if content == "" or "company" in lower_content:
        return "other"
    return None


def deid_process_record(text_txt: str, text_res: str) -> list[tuple[str, str]]:
    for marker in ["START_OF_RECORD=", "||||END_OF_RECORD"]:
        text_txt = text_txt.replace(marker, "")
        text_res = text_res.replace(marker, "")
    text_txt = re.sub(r"^\d+\|\|\|\|\d+\|\|\|\|", "", text_txt)
    text_res = re.sub(r"^\d+\|\|\|\|\d+\|\|\|\|", "", text_res)
    text_txt = text_txt.strip()
    text_res = text_res.strip()
    text_txt = text_txt.replace("\n", " ")
    text_res = text_res.replace("\n", " ")
    segments = re.split(r"(\[\*\*.*?\*\*\])", text_res)
    pointer = 0
    tokens_with_tags = []
    for i, segment in enumerate(segments):
        if i % 2 == 0:
            plain = segment
            for token in plain.split():
                tokens_with_tags.append((token, "O"))
            pointer += len(plain)
        else:
            cat = deid_map_mask(segment)
            next_plain = segments[i + 1] if (i + 1) < len(segments) else ""
            if next_plain:
                pos = text_txt.find(next_plain, pointer)
                if pos == -1:
                    pos = len(text_txt)
            else:
                pos = len(text_txt)
            masked_text = text_txt[pointer:pos]
            masked_tokens = masked_text.split()
            if masked_tokens:
                b_tag = f"B-{cat}" if cat is not None else "B"
                tokens_with_tags.append((masked_tokens[0], b_tag))
                for token in masked_tokens[1:]:
                    i_tag = f"I-{cat}" if cat is not None else "I"
                    tokens_with_tags.append((token, i_tag))
            pointer = pos
    return tokens_with_tags


def deid_examples(id_text: str, id_res: str) -> list[dict]:
    """DEID.preprocess_data's examples before its split (lines 177-191)."""
    examples = []
    for rec_txt, rec_res in zip(deid_load_records(id_text), deid_load_records(id_res)):
        tokens, tags = zip(*deid_process_record(rec_txt, rec_res))
        examples.append({"tokens": list(tokens), "ner_tags": list(tags)})
    return examples


# ------------------------------------------------------------------------- src/dataloader/dataloader.py: COS


def cos_process_ann_only(ann_path: str) -> list[dict]:
    snippets = []
    with open(ann_path, encoding="utf-8") as f:
        for line in f:
            if not line.startswith("T"):
                continue
            tid, rest = line.split("\t", 1)
            parts = rest.split()
            if parts[0] != "Snippet" or len(parts) < 4:
                continue
            start, end = map(int, parts[1:3])
            text = rest.split(None, 3)[-1].strip()
            snippets.append({"start": start, "end": end, "text": text})
    examples = []
    for snip in snippets:
        s_start, s_end, s_text = snip["start"], snip["end"], snip["text"]
        feats = []
        with open(ann_path, encoding="utf-8") as f2:
            for line in f2:
                if not line.startswith("T"):
                    continue
                tid, rest = line.split("\t", 1)
                parts = rest.split()
                label = parts[0]
                if label not in {"Cos", "Ref", "Loc", "Attr", "Val"} or len(parts) < 4:
                    continue
                start, end = map(int, parts[1:3])
                if start < s_start or end > s_end:
                    continue
                feats.append({"label": label, "start": start - s_start, "end": end - s_start})
        tokens, spans = [], []
        for m in re.finditer(r"\w+|[^\w\s]", s_text):
            tokens.append(m.group())
            spans.append((m.start(), m.end()))
        ner_tags = ["O"] * len(tokens)
        for feat in feats:
            idxs = [i for i, (ts, te) in enumerate(spans) if ts >= feat["start"] and te <= feat["end"]]
            if not idxs:
                continue
            ner_tags[idxs[0]] = f"B-{feat['label']}"
            for i in idxs[1:]:
                ner_tags[i] = f"I-{feat['label']}"
        examples.append({"tokens": tokens, "ner_tags": ner_tags})
    return examples


def cos_examples(folder: str) -> list[dict]:
    """COS.load_brat_as_dataset's examples before its split."""
    all_exs = []
    for fn in sorted(os.listdir(folder)):
        if not fn.endswith(".ann"):
            continue
        all_exs.extend(cos_process_ann_only(os.path.join(folder, fn)))
    return all_exs


# --------------------------------------------------------------- src/dataloader/dataloader.py: SocialHistory


def social_parse_ann_file(ann_path: str) -> list[dict]:
    anns = []
    with open(ann_path, encoding="utf-8") as f:
        for line in f:
            if not line.startswith("T"):
                continue
            parts = line.strip().split("\t")
            if len(parts) < 2:
                continue
            meta = parts[1].split()
            if len(meta) < 3:
                continue
            typ = meta[0]
            try:
                start, end = map(int, meta[1:3])
            except ValueError:
                continue
            anns.append({"start": start, "end": end, "type": typ})
    return sorted(anns, key=lambda x: x["start"])


def social_process_pair(txt_path: str, ann_path: str) -> dict:
    text = open(txt_path, encoding="utf-8").read()
    anns = social_parse_ann_file(ann_path)
    tokens = [(m.group(), m.start(), m.end()) for m in re.finditer(r"\S+", text)]
    labels = ["O"] * len(tokens)
    for ann in anns:
        st, en, typ = ann["start"], ann["end"], ann["type"]
        idxs = [i for i, (tok, s, e) in enumerate(tokens) if s >= st and e <= en]
        if not idxs:
            continue
        labels[idxs[0]] = f"B-{typ}"
        for i in idxs[1:]:
            labels[i] = f"I-{typ}"
    return {"tokens": [tok for tok, _, _ in tokens], "ner_tags": labels}


def social_examples(folder: str) -> list[dict]:
    """SocialHistory.load_brat_as_dataset's examples before its split."""
    examples = []
    for fn in sorted(os.listdir(folder)):
        if not fn.endswith(".txt"):
            continue
        base = fn[:-4]
        txt, ann = os.path.join(folder, fn), os.path.join(folder, base + ".ann")
        if not os.path.exists(ann):
            continue
        examples.append(social_process_pair(txt, ann))
    return examples
