"""Task types are entries: every entry is complete, and a setting a type does not read is refused (exit 2 on
the command line); that no module compares a type's name is tests/test_extension_points.py's."""

from __future__ import annotations


import pytest

from ablate.config.errors import SpecError
from ablate.evaluate.task_types import METRICS, TASK_TYPES, TYPE_SETTINGS
from ablate.evaluate.tasks import load_task


def test_every_entry_selects_by_a_metric_it_computes_and_reads_only_known_settings():
    for name, entry in TASK_TYPES.items():
        assert entry.selects_by in METRICS[name] and entry.reads <= set(TYPE_SETTINGS)
    assert {
        "token_classification",
        "sequence_classification",
        "sequence_pair_classification",
        "multi_label_classification",
        "regression",
        "span_ner",
    } <= set(TASK_TYPES)


@pytest.mark.parametrize(
    "task, setting",
    [("ncbi_disease", {"max_steps": 10}), ("hoc", {"head_lr": 1e-3}), ("quaero_emea_spans", {"pooling": "mean"})],
)
def test_a_setting_the_type_does_not_read_is_refused(tmp_path, task, setting, monkeypatch):
    import yaml

    from ablate.evaluate.tasks import tasks_dir

    spec = yaml.safe_load((tasks_dir() / f"{task}.yaml").read_text())
    spec["finetune"].update(setting)
    path = tmp_path / f"{task}.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(SpecError) as e:
        load_task(str(path))
    assert e.value.key == f"finetune.{next(iter(setting))}" and "never" in e.value.message


def test_the_cli_exits_2_for_an_unread_setting(tmp_path, capsys):
    import yaml

    from ablate.cli import main
    from ablate.evaluate.tasks import tasks_dir

    spec = yaml.safe_load((tasks_dir() / "quaero_emea_spans.yaml").read_text())
    spec["finetune"]["multi_label_pos_weight"] = False
    path = tmp_path / "quaero_emea_spans.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert main(["evaluate", str(tmp_path / "none"), "--task", str(path)]) == 2
    assert "finetune.multi_label_pos_weight" in capsys.readouterr().err
