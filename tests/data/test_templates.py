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
from mindfoundry.data.clean.shingling import unit_values
from mindfoundry.data.clean.templates import Templates, document_spans, site_documents, site_number, template_key
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


def test_span_keys_spread_over_key_ranges_and_name_their_site(pages: list[Document]) -> None:
    """A span key carries its site's number in its low bits: one site's spans fall in every key range of the
    boilerplate stage (no one task counts a whole site), and each key maps back to its site's sampled documents."""
    values = unit_values(pages[0].text, "chars")
    sites = {"": 40, "a.example.org": 7}
    keys = {site: document_spans(values, DedupConfig().templates.ngram, template_key("man", site)) for site in sites}
    assert len(np.unique(keys[""] >> np.uint64(60))) == 16  # all 16 top nibbles
    counted = site_documents(np.concatenate(list(keys.values())),
                             {site_number(template_key("man", site)): n for site, n in sites.items()})
    assert counted.tolist() == [40] * len(keys[""]) + [7] * len(keys["a.example.org"])


def test_templates_are_found_per_site_with_url_field(corpus_dir: Path, tmp_path: Path) -> None:
    """A source of crawled pages: the 40 man pages of one site among 900 news articles of another. The man site's
    template is in 4% of the source's documents, under ``min_share`` (5%), so counted per source it is no template and
    pages sharing only it merge; with ``url_field`` it is counted per site (the URL's host), where it is in every
    page, and no man page goes."""
    from mindfoundry.data.clean.droplog import read_drops
    from mindfoundry.data.ingest.builtin import read_builtin
    from mindfoundry.data.ingest.files import SourceStats

    news = [doc.text for doc in read_builtin("peoples_daily", stats=SourceStats()) if len(doc.text) >= 50][:900]
    records = [{"text": p.text, "url": f"https://man.example.org/{p.path}.1.html"} for p in _pages()]
    records += [{"text": text, "url": f"https://news.example.cn/1998/{i}.html"} for i, text in enumerate(news)]
    random.Random(0).shuffle(records)
    (tmp_path / "crawl.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records),
                                          encoding="utf-8")
    dropped = {}
    for url_field in (None, "url"):
        tree = tiny_run_tree(corpus_dir, tmp_path / f"run-{url_field}")
        source = {"name": "crawl", "paths": [str(tmp_path / "crawl.jsonl")], "url_field": url_field}
        tree["data"] = {"sources": [source], "validation_fraction": 0.2, "clean": {"enabled": False}}
        data = prepare_data(validate(tree), log=lambda _: None)
        lines = read_drops(Path(data.root) / "drops.jsonl.gz")
        dropped[url_field] = sum(line["reason"] == "near" and "man.example.org" in records[line["record"]]["url"]
                                 for line in lines)
    assert dropped == {None: 8, "url": 0}  # measured


def _site_with_chapter_indexes(pages: list[Document]) -> tuple[list[Document], list[Document]]:
    """The 40 man pages as a site: every page under a menu of 8 chapters that lists each page's NAME line, and a
    chapter index page per chapter whose entries are its menu lines (the page holds nothing the menu does not)."""
    names = [p.text.split("NAME\n", 1)[1].strip().split("\n")[0] for p in pages]
    chapters = [f"Chapter {k + 1}: commands\n" + "\n".join(names[5 * k:5 * k + 5]) for k in range(8)]
    menu = "Contents\n" + "\n".join(chapters) + "\n\n"
    site = [Document(menu + p.text, p.id, "site", "docs", p.path) for p in pages]
    indexes = [Document(menu + chapter, f"index:{k}", "site", "docs", f"index{k}")
               for k, chapter in enumerate(chapters)]
    return site, indexes


def test_a_page_of_template_alone_matches_only_its_copies(pages: list[Document]) -> None:
    """Chapter indexes are template through and through (their entries are the menu's): compared on their own text,
    which is none, they match their verbatim copies and not each other. On all their shingles (as they were compared
    before) they are one set, an entry being already in the menu. Templates off, the menu merges 38 of the 49
    pages."""
    site, indexes = _site_with_chapter_indexes(pages)
    copy = Document(indexes[3].text, "index:copy", "site", "docs", "index-copy")
    corpus = site + indexes + [copy]
    templates = count_templates(corpus, DedupConfig())
    signer, raw = Signer(templates=templates), Signer()
    own = [signer.hashes(p.text, "site") for p in indexes]
    assert max(jaccard(a, b) for a, b in itertools.combinations(own, 2)) == 0.0
    whole = [raw.hashes(p.text, "site") for p in indexes]
    assert min(jaccard(a, b) for a, b in itertools.combinations(whole, 2)) == 1.0
    dropped = {}
    for enabled in (True, False):
        dedup = Deduplicator(config=DedupConfig(exact=False), templates=count_templates(
            corpus, DedupConfig(templates={"enabled": enabled})))
        dedup.add_all(corpus)
        dropped[enabled] = sorted(dedup.finish().dropped)
    assert dropped[True] == ["index:copy"]
    assert len(dropped[False]) == 38
