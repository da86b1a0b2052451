"""Read, override, validate and resolve a run config.

The user-facing contract: any invalid config raises :class:`ConfigError` with one line per problem,
each naming the key path, the offending value and what to do. Nothing else in the tool starts
before this succeeds.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import json
from pathlib import Path
from typing import Any, Iterable

import yaml
from pydantic import BaseModel, ValidationError

from mindfoundry.config.aliases import canonical
from mindfoundry.config.checks import cross_field_problems
from mindfoundry.config.clean import JunkConfig, LanguageConfig
from mindfoundry.config.data_config import TemplatesConfig
from mindfoundry.config.image_config import ImagesConfig
from mindfoundry.config.layout_rules import config_problems
from mindfoundry.config.parallel_config import RENAMED_KEYS
from mindfoundry.config.schema import RunConfig, TrainConfig
from mindfoundry.config.storage_config import StorageConfig, redacted
from mindfoundry.config.vision_config import MAEConfig
from mindfoundry.config.yaml12 import load_yaml
from mindfoundry.errors import MindFoundryError


class ConfigError(MindFoundryError, ValueError):
    """An invalid configuration; the message is meant to be shown to the user as is."""

    label = "config error"


def _known_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Field names valid at `loc` (used to suggest the intended key for a typo)."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return []
        ann = field.annotation
        nested = [a for a in getattr(ann, "__args__", (ann,)) if isinstance(a, type) and issubclass(a, BaseModel)]
        if not nested:
            return []
        current = nested[0]
    return list(getattr(current, "model_fields", {}))


def _format_loc(loc: Iterable[Any]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _describe(error: dict[str, Any]) -> str:
    """Turn one pydantic error into 'key=value: problem; fix'."""
    loc = tuple(p for p in error["loc"] if not (isinstance(p, str) and p.startswith("function-")))
    # Literal/union branches append the branch name (e.g. 'float', 'literal['auto']'); drop them.
    loc = tuple(
        p for p in loc if not (isinstance(p, str) and ("[" in p or p in {"float", "int", "str", "bool", "none"}))
    )
    key = _format_loc(loc)
    if len(key) > MAX_QUOTED:  # an echoed key must stay readable however long the input's was
        key = f"{key[:MAX_QUOTED]}... ({len(key):,} characters)"
    kind = error["type"]
    if kind == "extra_forbidden":
        if key in RENAMED_KEYS:
            return f"unknown key '{key}': {RENAMED_KEYS[key]}"
        parent, name = loc[:-1], loc[-1]
        known = _known_keys(RunConfig, parent)
        close = difflib.get_close_matches(str(name)[:MAX_QUOTED], known, n=1)
        hint = (
            f"did you mean '{_format_loc(parent + (close[0],))}'?" if close else f"valid keys here: {', '.join(known)}"
        )
        return f"unknown key '{key}': {hint}"
    if kind == "missing":
        return f"missing required key '{key}': add it to the config"
    return f"{key}={quoted(error.get('input'))}: {error['msg'].removeprefix('Value error, ')}"


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    """Set `a.b.0.c` in a nested tree; numeric parts index lists (e.g. data.sources.0.max_bytes)."""
    parts = dotted.split(".")
    node: Any = tree
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(f"override '{dotted}': '{part}' is not an index of a list of {len(node)} items")
            key: Any = int(part)
        elif isinstance(node, dict):
            key = part
        else:
            raise ConfigError(f"override '{dotted}': '{parts[i - 1]}' is not a section")
        if last:
            current = node[key] if isinstance(node, list) or key in node else None
            node[key] = _merged(current, value) if isinstance(current, dict) and isinstance(value, dict) else value
        else:
            if isinstance(node, dict) and node.get(key) is None:
                node[key] = {}
            node = node[key]


def _merged(section: dict[str, Any], value: dict[str, Any]) -> dict[str, Any]:
    """``section`` with ``value``'s keys set into it, mapping into mapping (``--set 'train={steps: 2}'`` changes
    train.steps and keeps the section's other keys, rather than putting the section back to its defaults)."""
    out = dict(section)
    for key, item in value.items():
        out[key] = _merged(out[key], item) if isinstance(out.get(key), dict) and isinstance(item, dict) else item
    return out


def apply_overrides(tree: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply `key.path=value` overrides; values are parsed as YAML 1.2 (so 10 is an int, null is None), and a
    mapping merges into the section it names."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' must look like key.path=value (e.g. train.steps=10)")
        key, raw = item.split("=", 1)
        try:
            value = load_yaml(raw)
        except yaml.YAMLError as exc:
            raise ConfigError(f"override '{item}': value is not valid YAML ({getattr(exc, 'problem', exc)})") from None
        _set_dotted(tree, key.strip(), value)
    return tree


#: Bounds on what a config file may expand to. YAML aliases share one object however often they are
#: used, so a 1 KB file of nested aliases ("billion laughs") is 9^9 values to anything that walks it;
#: the bounds are checked before anything does.
MAX_CONFIG_BYTES = 4 << 20
MAX_CONFIG_VALUES = 100_000
MAX_CONFIG_DEPTH = 64
MAX_QUOTED = 200  # characters of a value an error message quotes


def quoted(value: Any) -> str:
    """repr(value), cut to :data:`MAX_QUOTED` characters (an error line must stay a line)."""
    text = repr(value)
    return text if len(text) <= MAX_QUOTED else f"{text[:MAX_QUOTED]}... ({len(text):,} characters)"


def _check_extent(tree: Any, where: str) -> None:
    """Refuse a tree deeper than MAX_CONFIG_DEPTH or with more than MAX_CONFIG_VALUES values once aliases are expanded.

    Iterative and stopping at the first bound crossed, so checking a bomb costs the bound, not the bomb."""
    stack, seen = [(tree, 1)], 0
    while stack:
        node, depth = stack.pop()
        seen += 1
        if seen > MAX_CONFIG_VALUES:
            raise ConfigError(
                f"{where} expands to more than {MAX_CONFIG_VALUES:,} values (YAML aliases repeating "
                f"nested lists?): a run config is a few hundred; write the values out or shorten the lists"
            )
        if depth > MAX_CONFIG_DEPTH:
            raise ConfigError(f"{where} nests deeper than {MAX_CONFIG_DEPTH} levels: a run config has about 5")
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)


def _check_nesting(text: str, path: Path) -> None:
    """Refuse nesting deeper than MAX_CONFIG_DEPTH before composing: PyYAML's parser is iterative but its
    composer recurses, so 20,000 nested brackets would end in a RecursionError after seconds of work."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_CONFIG_DEPTH:
                mark = event.start_mark
                raise ConfigError(
                    f"config file '{path}' nests deeper than {MAX_CONFIG_DEPTH} levels (at line {mark.line + 1}, "
                    f"column {mark.column + 1}): a run config has about 5"
                )
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Parse a YAML config file into a dict, with errors that name the file and line; bounded in size and depth."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file '{p}' not found: pass the path of a YAML config (e.g. configs/demo.yaml)")
    if p.stat().st_size > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file '{p}' is {p.stat().st_size:,} bytes: a run config is a few KB "
                          f"(at most {MAX_CONFIG_BYTES:,}); is this the right file?")
    try:
        text = p.read_text(encoding="utf-8")
        _check_nesting(text, p)
        tree = load_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"config file '{p}' is not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file '{p}' is not UTF-8 text") from None
    if tree is None:
        raise ConfigError(f"config file '{p}' is empty: start from configs/demo.yaml")
    if not isinstance(tree, dict):
        raise ConfigError(
            f"config file '{p}' must hold a mapping of sections (model, data, train, ...), not a {type(tree).__name__}"
        )
    _check_extent(tree, f"config file '{p}'")
    return tree


#: Keys that moved, old dotted path -> new one: a config written before the move (a stored run's config.yaml
#: included) still loads, its value carried to the new key unless that key is given too.
MOVED_KEYS: dict[str, str] = {"debug.locate_overflow": "debug.overflow.enable",
                              "data.tokenizer.train_max_bytes": "data.tokenizer.sample_bytes"}


def _holder(tree: dict[str, Any], dotted: str, *, create: bool = False) -> tuple[dict[str, Any] | None, str]:
    """The mapping that holds the last part of ``dotted`` (made on the way with ``create``), and that part;
    ``None`` when a part on the way is missing or not a mapping."""
    *parents, key = dotted.split(".")
    node: Any = tree
    for part in parents:
        node = (
            node.setdefault(part, {})
            if create and isinstance(node, dict)
            else node.get(part)
            if isinstance(node, dict)
            else None
        )
    return (node if isinstance(node, dict) else None), key


def _eval_batches(tree: dict[str, Any]) -> dict[str, Any]:
    """``train.eval_batches`` (validation micro-batches, until training-time evaluations scored the same samples
    whatever the batch shape) read as ``train.eval_samples``: that many micro-batches of ``train.micro_batch_size``
    sequences, the samples one process scored."""
    train = tree.get("train")
    if not isinstance(train, dict) or "eval_batches" not in train:
        return tree
    tree = copy.deepcopy(tree)
    batches = tree["train"].pop("eval_batches")
    micro = tree["train"].get("micro_batch_size", TrainConfig.model_fields["micro_batch_size"].default)
    both_ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (batches, micro))
    tree["train"].setdefault("eval_samples", batches * micro if both_ints else batches)  # a bad value: validation says
    return tree


def _moved(tree: dict[str, Any]) -> dict[str, Any]:
    """``tree`` with every :data:`MOVED_KEYS` old key carried to its new place (a copy when any moved). Where
    the new place cannot hold it (a parent that is not a mapping), validation names that parent."""
    for old, new in MOVED_KEYS.items():
        holder, key = _holder(tree, old)
        if holder is None or key not in holder:
            continue
        tree = copy.deepcopy(tree)
        holder, key = _holder(tree, old)
        value = holder.pop(key)
        target, new_key = _holder(tree, new, create=True)
        if target is not None:
            target.setdefault(new_key, value)
    return tree


def validate(tree: dict[str, Any]) -> RunConfig:
    """Validate a config tree and resolve derived values; raise ConfigError listing every problem: the fields', the
    cross-field rules' (:mod:`mindfoundry.config.checks`), then the parallel layout's
    (:mod:`mindfoundry.config.layout_rules`)."""
    _check_extent(tree, "the config")
    tree, alias_problems = canonical(_moved(_eval_batches(tree)))
    if alias_problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(alias_problems))
    try:
        cfg = RunConfig.model_validate(tree)
    except ValidationError as exc:
        lines = [_describe(e) for e in exc.errors()]
        raise ConfigError("invalid config:\n  " + "\n  ".join(lines)) from None
    problems = cross_field_problems(cfg) + config_problems(cfg)
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))
    return resolve(cfg)


def storage_settings(overrides: Iterable[str]) -> StorageConfig:
    """The ``storage`` section of ``--set storage.KEY=VALUE`` overrides alone: how a command that takes a path or URL
    but no config (eval, generate, export, convert, ckpt) reaches a URL. Any other key is refused by name."""
    tree = apply_overrides({}, overrides)
    others = sorted(set(tree) - {"storage"})
    if others:
        raise ConfigError(f"--set {others[0]}: this command takes no config, only storage.* settings (how URLs are "
                          "reached, e.g. --set storage.endpoint_url=https://obs.cn-north-4.myhuaweicloud.com)")
    try:
        return StorageConfig.model_validate(tree.get("storage") or {})
    except ValidationError as exc:
        lines = [_describe({**e, "loc": ("storage", *e["loc"])}) for e in exc.errors()]
        raise ConfigError("invalid storage settings:\n  " + "\n  ".join(lines)) from None


def resolve(cfg: RunConfig) -> RunConfig:
    """Fill every `null = derived` default so the resolved config is explicit and reproducible."""
    cfg = cfg.model_copy(deep=True)
    m = cfg.model
    if m.n_kv_heads is None:
        m.n_kv_heads = m.n_heads
    if m.ffn_dim is None:
        m.ffn_dim = m.resolved_ffn_dim()
    if m.vision is not None:
        if m.vision.image_size is None:
            m.vision.image_size = cfg.data.images.size
        m.vision.ffn_dim = m.vision.resolved_ffn_dim()
        m.mae.decoder_ffn_dim = m.mae.resolved_ffn_dim()
    p = cfg.parallel
    if p.dp_shard != -1 or p.world_size is not None:  # else both stay open until launch
        layout = p.layout()
        p.dp_shard, p.world_size = layout.dp_shard, layout.world_size
        if cfg.optim.clip_norm == "auto":  # refused by checks.py while the layout is open
            cfg.optim.clip_norm = round(0.5 * (layout.global_batch(cfg.train) / 1024) ** 0.5, 6)
    if cfg.run_dir is None:
        cfg.run_dir = f"runs/{cfg.name}"
    if cfg.data.output_dir is None:
        cfg.data.output_dir = str(Path(cfg.run_dir) / "data")
    for src in cfg.data.sources:
        src.category = src.resolved_category()
    return cfg


def load_config(path: str | Path, overrides: Iterable[str] = ()) -> RunConfig:
    """Read FILE, apply overrides, validate (see :func:`validate`) and resolve: what every command loads."""
    return validate(apply_overrides(read_yaml(path), overrides))


def public_dump(cfg: RunConfig) -> dict[str, Any]:
    """The config as a tree that may be written or shown: every secret option replaced
    (:func:`~mindfoundry.config.storage_config.redacted`). What a run stores, `config show` prints and a resume
    compares, so a stored config and a live one differ only where the user changed something."""
    tree = cfg.model_dump(mode="json")
    tree["storage"]["options"] = redacted(tree["storage"]["options"])
    return tree


def to_yaml(cfg: RunConfig) -> str:
    """The fully resolved config as YAML (what `config show` prints and runs store): :func:`public_dump`."""
    return yaml.safe_dump(public_dump(cfg), sort_keys=False, allow_unicode=True)


#: Keys added after release 0.1.0 (dotted; ``*`` stands for every element of a list) with the default each came
#: with. Identity hashes leave such a key out while it holds that default, so a run or a prepared data folder made
#: by 0.1.0 keeps its identity and resumes (tests/checkpoint/test_legacy_resume.py); set to anything else, it counts.
ADDED_KEYS: dict[str, Any] = {
    "parallel.grad_fusion_groups": None,
    "model.moe.capacity_factor": None,
    "train.flash_attention": "auto",
    "model.objective": "clm",
    "model.mlm": {"mask_rate": 0.15, "mask_token_rate": 0.8, "random_token_rate": 0.1},
    "data.dedup.shingle": "chars",
    "data.dedup.templates": TemplatesConfig().model_dump(mode="json"),
    "data.clean.junk": JunkConfig().model_dump(mode="json"),
    "data.clean.language": LanguageConfig().model_dump(mode="json"),
    "data.images": ImagesConfig().model_dump(mode="json"),
    "data.sources.*.modality": "text",
    "data.sources.*.image_field": "image",
    "data.sources.*.url_field": None,
    "data.sources.*.clean.language": None,
    "data.sources.*.clean.junk": None,
    "data.clean.nfkc.fold": "width",
    "data.clean.timestamps.years": True,
    "data.sources.*.clean.timestamps.years": True,
    "data.sources.*.clean.nfkc.fold": "width",
    "model.vision": None,
    "model.mae": MAEConfig().model_dump(mode="json"),
    "train.freeze": [],
    **{f"{section}.{key}": default for section in ("data.clean", "data.sources.*.clean")
       for key, default in (("mojibake.max_gbk_mojibake_ratio", 0.05), ("quality.min_rest_share", 0.5))},
    **{f"{section}.repetition.{key}": default for section in ("data.clean", "data.sources.*.clean")
       for key, default in (("window_units", 1000), ("ngram_min_units", 100), ("min_rest_share", 0.5))},
    **{f"{section}.boilerplate.{key}": default for section in ("data.clean", "data.sources.*.clean")
       for key, default in (("edge_lines", 6), ("edge_block_lines", 2), ("min_source_share", 0.5),
                                              ("body_lines", True))},
}


#: Keys whose default changed after release 0.1.0: dotted key -> (0.1.0's default, today's). Identity hashes write
#: today's default as 0.1.0's, so a run or data folder made by 0.1.0 with the default keeps its identity and resumes on
#: the data it was prepared with. (A config that sets 0.1.0's value explicitly shares that identity.)
CHANGED_DEFAULTS: dict[str, tuple[Any, Any]] = {
    # near-duplicate recall on 4% character edits (issue #34): 0.60 at Jaccard 0.7 with 20x5 bands, 1.0 at 0.55 with
    # 32x4
    "data.dedup.threshold": (0.7, 0.55),
    "data.dedup.bands": (20, 32),
    "data.dedup.rows": (5, 4),
}

#: Keys that moved (:data:`MOVED_KEYS`) after release 0.1.0 and count in identities, dotted new name -> old last part.
#: Identity hashes use the old name, so a run or a prepared data folder made before the move keeps its identity.
IDENTITY_OLD_NAMES: dict[str, str] = {"data.tokenizer.sample_bytes": "train_max_bytes"}


def _node(tree: dict[str, Any], path: list[str]) -> Any:
    """The mapping at ``path`` in ``tree`` (None where a part is missing)."""
    node: Any = tree
    for part in path:
        node = node.get(part) if isinstance(node, dict) else None
    return node


def identity_view(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A dumped config (or the section at ``prefix``, e.g. ``"data."``) without the :data:`ADDED_KEYS` at their
    defaults,
    the :data:`CHANGED_DEFAULTS` at today's default written as 0.1.0's, the :data:`IDENTITY_OLD_NAMES` under their old
    names."""
    def strip(node: Any, path: list[str], default: Any) -> None:
        if isinstance(node, list):
            for item in node:
                strip(item, path[1:] if path[0] == "*" else path, default)
        elif isinstance(node, dict) and path:
            if len(path) == 1:
                if path[0] in node and node[path[0]] == default:
                    del node[path[0]]
            elif node.get(path[0]) is not None:
                strip(node[path[0]], path[1:], default)

    view = copy.deepcopy(tree)
    for key, default in ADDED_KEYS.items():
        if key.startswith(prefix):
            strip(view, key.removeprefix(prefix).split("."), default)
    for key, (old_default, default) in CHANGED_DEFAULTS.items():
        if key.startswith(prefix):
            *parents, name = key.removeprefix(prefix).split(".")
            node = _node(view, parents)
            if isinstance(node, dict) and node.get(name) == default:
                node[name] = old_default
    for key, old in IDENTITY_OLD_NAMES.items():
        if not key.startswith(prefix):
            continue
        *parents, new = key.removeprefix(prefix).split(".")
        node = _node(view, parents)
        if isinstance(node, dict) and new in node:
            node[old] = node.pop(new)
    return view


def excluded_dump(cfg: RunConfig, exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    """The resolved config as JSON values without ``exclude``: sections or dotted keys (``model.init_from``)."""
    nested: dict[str, Any] = {}
    for key in exclude:
        section, _, field = key.partition(".")
        nested[section] = True if not field else (nested.get(section) or {}) | {field: True}
    return cfg.model_dump(mode="json", exclude=nested)


def tree_hash(tree: dict[str, Any]) -> str:
    """Stable hash of a dumped config's :func:`identity_view`."""
    return hashlib.sha256(json.dumps(identity_view(tree), sort_keys=True).encode()).hexdigest()


def config_hash(cfg: RunConfig, *, exclude: tuple[str, ...] = ()) -> str:
    """Stable hash of the resolved config; `exclude` names sections or dotted keys (``model.init_from``) left out,
    so a key added to a section later can stay out of the hash of every earlier config."""
    return tree_hash(excluded_dump(cfg, exclude))
