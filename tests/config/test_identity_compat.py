"""Keys added after release 0.1.0 stay out of identity hashes at their defaults, and count once changed."""

from __future__ import annotations

from mf_testing import tiny_config
from mindfoundry.config.load import ADDED_KEYS, CHANGED_DEFAULTS, config_hash, identity_view
from mindfoundry.data.prepare.pipeline import data_identity


def test_added_keys_at_their_default_leave_the_hashes_unchanged() -> None:
    cfg = tiny_config()
    dumped = cfg.model_dump(mode="json")
    view = identity_view(dumped)
    for key in ADDED_KEYS:
        section, *rest = key.split(".")
        if "*" not in rest:
            node = view[section]
            for part in rest[:-1]:
                node = node[part]
            assert rest[-1] not in node, key
    assert dumped["data"]["dedup"]["shingle"] == "chars"  # the dump itself (config show, stored runs) keeps them


def test_an_added_key_set_away_from_its_default_changes_both_identities() -> None:
    base, changed = (
        tiny_config(),
        tiny_config(data={"sources": [{"name": "c", "paths": ["x"]}], "dedup": {"shingle": "words"}}),
    )
    assert config_hash(base) != config_hash(changed)
    assert data_identity(base) != data_identity(changed)


def test_the_tokenizer_sample_keeps_its_old_name_in_configs_and_identities() -> None:
    """data.tokenizer.sample_bytes was train_max_bytes until the staged prepare: old configs still read, and the
    identities of runs and data folders made before are the same (tests/checkpoint/test_legacy_resume.py resumes
    one)."""
    new = tiny_config(data={"sources": [{"name": "c", "paths": ["x"]}], "tokenizer": {"sample_bytes": 1000}})
    old = tiny_config(data={"sources": [{"name": "c", "paths": ["x"]}], "tokenizer": {"train_max_bytes": 1000}})
    assert old.data.tokenizer.sample_bytes == 1000 and config_hash(old) == config_hash(new)
    assert data_identity(old) == data_identity(new)
    assert identity_view(new.model_dump(mode="json"))["data"]["tokenizer"]["train_max_bytes"] == 1000
    both = tiny_config(
        data={"sources": [{"name": "c", "paths": ["x"]}], "tokenizer": {"train_max_bytes": 5, "sample_bytes": 1000}}
    )
    assert (
        both.data.tokenizer.sample_bytes == 1000
    )  # as for every moved key (config.load.MOVED_KEYS): the new name wins


def test_a_changed_default_counts_in_identities_as_the_old_default_and_other_values_count() -> None:
    """data.dedup.threshold/bands/rows were 0.7/20/5 in 0.1.0: today's defaults hash as those (a 0.1.0 run resumes on
    the data it prepared), and any other value changes both identities."""
    sources = {"sources": [{"name": "c", "paths": ["x"]}]}
    today, old = (
        tiny_config(data=sources),
        tiny_config(data={**sources, "dedup": {"threshold": 0.7, "bands": 20, "rows": 5}}),
    )
    assert today.data.dedup.threshold == CHANGED_DEFAULTS["data.dedup.threshold"][1] == 0.55
    assert config_hash(today) == config_hash(old) and data_identity(today) == data_identity(old)
    other = tiny_config(data={**sources, "dedup": {"threshold": 0.6}})
    assert config_hash(other) != config_hash(today) and data_identity(other) != data_identity(today)
