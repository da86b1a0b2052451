"""Page templates for near-duplicate detection: text that recurs across many documents of a source.

Pages of one site share a header, a menu and a footer; man pages share a section skeleton and option
boilerplate. Two short pages that share only that template reach a Jaccard similarity of 0.6-0.9 on
character 5-grams although their content differs. So dedup discounts the template, in two steps:

1. *Template spans*: a span is an ``ngram``-unit window of a document's shingle stream (its letters and
   digits, or its words: :func:`~mindfoundry.data.clean.shingling.unit_values`); one found in at least
   ``min_documents`` and at least ``min_share`` of the sampled documents of its source is a template span.
   Spans are much longer than shingles (30 characters against 5 by default) so that what recurs is a template
   and not the language: a frequent character 5-gram ("ation", "的一个") is in most documents of any source, a
   frequent 30-character span is a menu, a footer or a formula.
2. *Template shingles*: the shingles that lie wholly inside template spans of the sampled documents. Every
   document of the source leaves them out of its shingle set (:meth:`Templates.outside`). Deciding by the
   shingle and not by its position keeps the discount symmetric: an edited copy of a page loses the same
   template shingles as the page, except the few an edit touched, while a position-based rule would keep
   every shingle of an edited template region in the copy alone.

Counting is on a sample of each source, its first ``sample`` documents (split evenly over the source's
read tasks in `prepare`), which bounds the work whatever the corpus size: a template worth discounting is
in a fair share of a source's pages, so a sample of a few thousand sees it. Templates belong to a *site*:
the source, or where the source names a ``url_field`` the source and the host of each page's URL
(:func:`template_key`), since a source of crawled pages holds many sites and the template of a site that is a
small share of the source would not reach ``min_share`` of it. Span and shingle keys are salted with the
site's key, and a span key carries the site's 16-bit number in its low bits (:func:`site_documents`), so the counts
of a span are compared with its own site's sampled documents. A page made only of template shingles (a chapter index
whose entries are also the site's menu) has no text of its own to compare: its shingles are salted with its whole
text (:meth:`~mindfoundry.data.clean.dedup.Signer.hashes`), so it matches its verbatim copies and no other page.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from mindfoundry.data.clean.keysets import in_sorted
from mindfoundry.data.clean.shingling import MIX, shingle_keys, window_keys

_NONE = np.zeros(0, dtype=np.uint64)


#: A span key's low 16 bits: its site's number (the high bits, the salted window key, spread keys evenly over the
#: boilerplate stage's key ranges).
_SITE_BITS = np.uint64(0xFFFF)


def template_key(source: str, site: str = "") -> str:
    """Whose templates a document shares: its source's, or its source's site's (its URL's host)."""
    return f"{source}\x00{site}" if site else source


def source_salt(source: str) -> np.uint64:
    """The number a site's (:func:`template_key`) span and shingle keys are mixed with (stable across processes);
    dedup's comparison groups are numbered alike."""
    return np.uint64((zlib.crc32(source.encode("utf-8")) + 1) * int(MIX) % 2**64)


def site_number(key: str) -> int:
    """The 16-bit number of a site (:func:`template_key`) that its span keys carry in their low bits."""
    return zlib.crc32(key.encode("utf-8")) >> 16


def site_documents(keys: np.ndarray, documents: dict[int, int]) -> np.ndarray:
    """Per span key, the sampled documents of its site (``documents``: per site number, its low 16 bits)."""
    sites = sorted(documents)
    if not sites:
        return np.zeros(len(keys), np.int64)
    counted = np.array([documents[site] for site in sites], dtype=np.int64)
    return counted[np.searchsorted(np.array(sites, dtype=np.uint64), keys & _SITE_BITS)]


def _span_keys(values: np.ndarray, ngram: int, key: str) -> np.ndarray:
    """A document's span keys (one per position): the salted window key, its site's number in the low bits."""
    return (window_keys(values, ngram) ^ source_salt(key)) & ~_SITE_BITS | np.uint64(site_number(key))


def _inside(starts: np.ndarray, ends: np.ndarray, size: int) -> np.ndarray:
    """A mask of ``size`` positions, true inside any ``[start, end)`` range."""
    return np.cumsum(np.bincount(starts, minlength=size + 1) - np.bincount(ends, minlength=size + 1))[:-1] > 0


def document_spans(values: np.ndarray, ngram: int, source: str) -> np.ndarray:
    """The distinct span keys of one document of site ``source`` (:func:`template_key`; none when it is shorter than
    a span): what the count adds."""
    if len(values) < ngram:
        return _NONE
    return np.unique(_span_keys(values, ngram, source))


def covered_shingles(values: np.ndarray, shingle_ngram: int, spans: np.ndarray, ngram: int,
                     source: str) -> np.ndarray:
    """The salted keys of one sampled document's shingles that lie wholly inside template spans (``spans``:
    the sorted template span keys)."""
    if len(values) < ngram:
        return _NONE
    hits = np.flatnonzero(in_sorted(spans, _span_keys(values, ngram, source)))
    if not len(hits):
        return _NONE
    covered = np.concatenate(([0], np.cumsum(_inside(hits, hits + ngram, len(values)))))
    n = min(shingle_ngram, len(values))
    windows = len(values) - n + 1
    whole = covered[n:n + windows] - covered[:windows] == n
    return np.unique(shingle_keys(values, n)[whole] ^ source_salt(source))


@dataclass(frozen=True)
class Templates:
    """Every source's template shingles: their salted keys, sorted."""

    keys: np.ndarray

    def __bool__(self) -> bool:
        return bool(len(self.keys))

    def outside(self, keys: np.ndarray, source: str, shingle_ngram: int) -> np.ndarray | None:
        """A mask over a document's shingle keys (one per position), true for those that are not its source's template
        shingles; None when none is (keep every shingle), all false for a page that is template through and through.
        A run of at most ``shingle_ngram + 1`` positions between template shingles counts as template: one edited
        character inside a template changes that many shingles, which are template text all the same."""
        template = in_sorted(self.keys, keys ^ source_salt(source))
        if not template.any():
            return None
        change = np.flatnonzero(np.diff(template.astype(np.int8))) + 1
        starts, ends = np.concatenate(([0], change)), np.concatenate((change, [len(template)]))
        gap = ~template[starts] & (starts > 0) & (ends < len(template)) & (ends - starts <= shingle_ngram + 1)
        template |= _inside(starts[gap], ends[gap], len(template))
        return ~template
