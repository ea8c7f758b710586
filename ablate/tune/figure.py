"""The tune figure: optimisation history (each trial's value, pruned trials at their last reported value,
the best so far) and parameter importances, from the study behind a tune's folder (its study.json) or
the storage named.

May import: config, tune.storage.
"""

from __future__ import annotations

from pathlib import Path

from ablate.config.errors import SpecError
from ablate.tune.storage import STUDY_RECORD, open_storage, storage_url, study_record


def load_study(sweep_dir: Path, study: str = "", storage: str = ""):
    """The study behind a tune's folder (its study.json), or the one named in `storage`."""
    import optuna

    if storage:
        url = storage_url(storage, Path(sweep_dir)) if storage in ("sqlite", "journal") else storage
        name = study or None
    else:
        info_file = Path(sweep_dir) / STUDY_RECORD
        if not info_file.is_file():
            raise SpecError(
                "this folder holds no Optuna study (no study.json): run `ablate tune` first, or give "
                "--set storage=URL",
                file=str(sweep_dir),
                key="study.json",
            )
        url, recorded = study_record(info_file)
        name = study or recorded
    names = optuna.get_all_study_names(open_storage(url))
    name = name or (names[0] if len(names) == 1 else None)
    if name not in names:
        raise SpecError("no such study in the storage", key="study", value=name, allowed=", ".join(names))
    return optuna.load_study(study_name=name, storage=open_storage(url))


def tune_figure(sweep, *, study: str = "", storage: str = ""):
    """Optimisation history (each trial's value, pruned trials at their last reported value, the best so
    far) and parameter importances (fANOVA over complete trials), from the study behind a tune's folder."""
    import pandas as pd
    from matplotlib.figure import Figure
    from optuna.trial import TrialState

    st = load_study(Path(sweep.path), study, storage)
    maximize = st.direction.name == "MAXIMIZE"
    rows, best = [], None
    for t in st.get_trials(deepcopy=False):
        if t.state == TrialState.COMPLETE:
            value = t.value
            best = value if best is None else (max(best, value) if maximize else min(best, value))
        elif t.state == TrialState.PRUNED and t.intermediate_values:
            value = t.intermediate_values[max(t.intermediate_values)]
        else:
            value = None
        rows.append(
            {
                "part": "history",
                "trial": t.number,
                "state": t.state.name.lower(),
                "value": value,
                "best_so_far": best,
                "param": None,
                "importance": None,
            }
        )
    complete = [t for t in st.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    importances: dict[str, float] = {}
    note = ""
    if len(complete) >= 2:
        try:
            from optuna.importance import get_param_importances

            importances = get_param_importances(st)
        except (RuntimeError, ValueError) as exc:
            note = str(exc)
    else:
        note = "needs at least 2 complete trials"
    for param, imp in importances.items():
        rows.append(
            {
                "part": "importance",
                "trial": None,
                "state": None,
                "value": None,
                "best_so_far": None,
                "param": param,
                "importance": imp,
            }
        )
    data = pd.DataFrame(rows, columns=["part", "trial", "state", "value", "best_so_far", "param", "importance"])

    fig = Figure(figsize=(10, 3.8), layout="constrained")
    ax, ax2 = fig.subplots(1, 2, width_ratios=[1.3, 1])
    hist = data[data["part"] == "history"]
    markers = {"complete": ("o", "tab:blue"), "pruned": ("x", "tab:orange"), "fail": ("s", "tab:red")}
    for state, (marker, color) in markers.items():
        d = hist[(hist["state"] == state) & hist["value"].notna()]
        if not d.empty:
            ax.scatter(d["trial"], d["value"], marker=marker, color=color, label=state, zorder=3)
    b = hist[hist["best_so_far"].notna()]
    if not b.empty:
        ax.step(b["trial"], b["best_so_far"], where="post", color="black", lw=1, label="best so far")
    ax.set_xlabel("trial")
    ax.set_ylabel(f"objective ({st.direction.name.lower()})")
    ax.set_title(f"optimisation history: {st.study_name}")
    ax.legend(fontsize=8)
    imp = data[data["part"] == "importance"].iloc[::-1]
    if not imp.empty:
        ax2.barh(imp["param"], imp["importance"], color="tab:blue")
        ax2.set_xlabel("importance (fANOVA)")
    else:
        ax2.text(
            0.5, 0.5, f"no importances: {note}", ha="center", va="center", transform=ax2.transAxes, fontsize=9
        )
        ax2.set_axis_off()
    ax2.set_title("parameter importances")
    return fig, data
