"""Near-duplicates past page templates: man pages that share only their skeleton and option boilerplate are not
duplicates, a page and its edited copy still are, in memory and in `prepare`'s stages.

The fixture is 40 GNU coreutils man pages (Debian's coreutils 9.1, rendered by groff at 80 columns), each a
different command: pages that document one thing under several names (ls/dir/vdir, the checksum family) were left
out by the labelled benchmark's ``distinct_pages`` (bench/dedup_benchmark.py).
"""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import numpy as np
import pytest

from dedup_benchmark import char_edits
from dedup_reference import Deduplicator, count_templates
from mf_testing import tiny_run_tree
from mindfoundry.config.data_config import DedupConfig
from mindfoundry.config.load import ConfigError, validate
from mindfoundry.data.clean.dedup import Signer, jaccard
from mindfoundry.data.clean.templates import Templates
from mindfoundry.data.document import Document
from mindfoundry.data.prepare.pipeline import prepare_data

FIXTURE = Path(__file__).parent.parent / "fixtures" / "templates" / "coreutils_man.jsonl"
THRESHOLD = 0.55  # data.dedup.threshold


def _pages() -> list[Document]:
    pages = [json.loads(line) for line in FIXTURE.read_text(encoding="utf-8").splitlines()]
    return [Document(p["text"], f"man:{p['name']}", "man", "docs", p["name"]) for p in pages]


def _twins(pages: list[Document], rate: float = 0.02) -> list[Document]:
    rng = random.Random(0)
    return [Document(char_edits(p.text, rate, "en", rng), f"{p.id}#copy", "man", "docs", f"{p.path}#copy")
            for p in pages]


@pytest.fixture(scope="module")
def pages() -> list[Document]:
    return _pages()


@pytest.fixture(scope="module")
def templates(pages: list[Document]) -> Templates:
    return count_templates(pages, DedupConfig())


def test_pages_that_share_only_their_template_stop_matching(pages: list[Document], templates: Templates) -> None:
    raw, discounted = Signer(), Signer(templates=templates)
    before = [jaccard(raw.hashes(a.text, "man"), raw.hashes(b.text, "man"))
              for a, b in itertools.combinations(pages, 2)]
    after = [jaccard(discounted.hashes(a.text, "man"), discounted.hashes(b.text, "man"))
             for a, b in itertools.combinations(pages, 2)]
    # measured: 22 of the 780 pairs reach 0.55 on the template alone (arch/hostid 0.671, link/logname 0.699, most
    # 0.726); with the template discounted none does (most 0.443)
    assert sum(j >= THRESHOLD for j in before) == 22 and max(before) == pytest.approx(0.726, abs=5e-4)
    assert sum(j >= THRESHOLD for j in after) == 0 and max(after) == pytest.approx(0.443, abs=5e-4)
    assert len(templates.keys) == 543  # measured: the template shingles of the 40 pages


def test_a_page_and_its_edited_copy_still_match(pages: list[Document], templates: Templates) -> None:
    signer = Signer(templates=templates)
    similarity = [jaccard(signer.hashes(p.text, "man"), signer.hashes(t.text, "man"))
                  for p, t in zip(pages, _twins(pages), strict=True)]
    assert min(similarity) == pytest.approx(0.604, abs=5e-4)  # measured, 2% of the characters edited


def test_an_edit_inside_the_template_leaves_the_same_shingles(pages: list[Document], templates: Templates) -> None:
    """A discount by shingle and not by position is symmetric: one edited character in the template changes only
    template shingles, which are left out of the copy as of the page."""
    page = next(p for p in pages if p.path == "arch")
    footer = "display this help and exit"
    assert footer in page.text
    edited = page.text.replace(footer, footer.replace("help", "hxlp"))
    signer = Signer(templates=templates)
    assert np.array_equal(signer.hashes(edited, "man"), signer.hashes(page.text, "man"))
    assert not np.array_equal(Signer().hashes(edited, "man"), Signer().hashes(page.text, "man"))


def test_templates_belong_to_their_source(pages: list[Document], templates: Templates) -> None:
    text = pages[0].text
    assert np.array_equal(Signer(templates=templates).hashes(text, "other"), Signer().hashes(text, "other"))
    assert len(Signer(templates=templates).hashes(text, "man")) < len(Signer().hashes(text, "other"))


def test_dedup_keeps_every_page_and_drops_every_copy(pages: list[Document]) -> None:
    corpus = pages + _twins(pages)
    found = {}
    for enabled in (True, False):
        dedup = Deduplicator(templates=count_templates(corpus, DedupConfig(templates={"enabled": enabled})))
        dedup.add_all(corpus)
        result = dedup.finish()
        wrong = [doc for doc, twin in result.twins.items() if twin.kept["path"] != doc.split(":", 1)[1].split("#")[0]]
        found[enabled] = (len(result.dropped), len(wrong))
    # measured: with the discount the 40 copies go, each for its page; without it 44 documents go, 14 of them for a
    # different command's page (and some copies with them)
    assert found == {True: (40, 0), False: (44, 14)}


def test_a_page_copied_a_few_times_is_not_a_template(pages: list[Document]) -> None:
    """Five edited copies of one page in a small source: its text is in 6 of 26 documents (23%), but under
    ``min_documents`` (10), so it is no template and every copy still goes."""
    rng = random.Random(1)
    base = pages[5]
    copies = [Document(char_edits(base.text, 0.02, "en", rng), f"man:copy{i}", "man", "docs", f"copy{i}")
              for i in range(5)]
    corpus = pages[:20] + copies
    dedup = Deduplicator(templates=count_templates(corpus, DedupConfig()))
    dedup.add_all(corpus)
    result = dedup.finish()
    assert set(result.dropped) == {c.id for c in copies}
    assert {twin.kept["path"] for twin in result.twins.values()} == {base.path}


def test_prepare_discounts_templates_as_the_in_memory_dedup(corpus_dir: Path, tmp_path: Path) -> None:
    """Two read tasks (the pages, then the copies): the staged count, reduce and template shingles decide the same
    drops as counting in memory."""
    pages = _pages()
    copies = _twins(pages, 0.04)
    folder = tmp_path / "man"
    folder.mkdir()
    for name, docs in (("pages", pages), ("copies", copies)):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps({"text": d.text}) + "\n" for d in docs),
                                              encoding="utf-8")
    corpus = [Document(d.text, f"man:{name}.jsonl:{i + 1}", "man", "docs", f"{name}.jsonl", i)
              for name, docs in (("copies", copies), ("pages", pages)) for i, d in enumerate(docs)]
    memory = Deduplicator(templates=count_templates(corpus, DedupConfig()))
    memory.add_all(corpus)
    expected = memory.finish()
    tree = tiny_run_tree(corpus_dir, tmp_path / "run")
    tree["data"] = {"sources": [{"name": "man", "paths": [str(folder)]}], "validation_fraction": 0.2,
                    "clean": {"enabled": False}}
    logged: list[str] = []
    data = prepare_data(validate(tree), log=logged.append)
    timing = {"seconds", "documents_per_second"}
    assert {k: v for k, v in data.manifest["dedup"].items() if k not in timing} == \
        {k: v for k, v in expected.report.items() if k not in timing}
    # measured: 36 of the 40 pages or their 4%-edited copies go (the files are read in name order: copies first, so
    # a page goes for its copy); the other 4, short pages with little text of their own, stay under 0.55
    assert data.manifest["dedup"]["near"]["removed"] == 36
    assert any(line.startswith("dedup templates: ") for line in logged), logged


@pytest.mark.parametrize(
    ("templates", "message"),
    [
        ({"min_share": 2}, "data.dedup.templates.min_share=2: Input should be less than or equal to 1"),
        ({"ngram": 1}, "data.dedup.templates.ngram=1: Input should be greater than or equal to 2"),
    ],
)
def test_bad_template_settings_name_the_key(templates: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        validate({"data": {"sources": [{"name": "c", "paths": ["x"]}], "dedup": {"templates": templates}}})
    assert message in str(info.value)
