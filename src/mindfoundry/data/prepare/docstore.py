"""Documents on disk between two stages of `prepare`: a task's documents, streamed out and read back.

A store is a folder: ``text.bin`` (the UTF-8 texts back to back) with its offsets, ``ids.bin``
likewise, and per document its path and site (indices into ``paths.json``'s lists), record and *ordinal* (its
position among the documents the task read, which orders drop-log lines across stages). Offsets
and columns are ``.npy`` files opened memory-mapped, so a later stage reads one document by row
(dedup's exact verification, the kept twin of a dropped one) without loading the store.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import numpy as np

from mindfoundry.data.document import Document

_COLUMNS = ("path_index", "record", "ordinal", "site_index")


class DocWriter:
    """Appends documents to a new store in ``folder``; :meth:`close` writes the index columns."""

    def __init__(self, folder: Path, source: str, category: str) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.source, self.category = source, category
        self._text: IO[bytes] = open(folder / "text.bin", "wb")
        self._ids: IO[bytes] = open(folder / "ids.bin", "wb")
        self._offsets = {"text": array("q", [0]), "ids": array("q", [0])}
        self._columns = {name: array("q") for name in _COLUMNS}
        self._paths: dict[str, int] = {}
        self._sites: dict[str, int] = {}
        self.chars = 0

    def add(self, doc: Document, ordinal: int) -> None:
        for name, fh, value in (("text", self._text, doc.text), ("ids", self._ids, doc.id)):
            data = value.encode("utf-8")
            fh.write(data)
            self._offsets[name].append(self._offsets[name][-1] + len(data))
        self._columns["path_index"].append(self._paths.setdefault(doc.path, len(self._paths)))
        self._columns["record"].append(doc.record)
        self._columns["ordinal"].append(ordinal)
        self._columns["site_index"].append(self._sites.setdefault(doc.site, len(self._sites)))
        self.chars += len(doc.text)

    def close(self) -> int:
        """Finish the store; return its number of documents."""
        self._text.close()
        self._ids.close()
        for name, offsets in self._offsets.items():
            np.save(self.folder / f"{name}.offsets.npy", np.frombuffer(offsets, dtype=np.int64))
        for name, values in self._columns.items():
            np.save(
                self.folder / f"{name}.npy", np.frombuffer(values, dtype=np.int64) if values else np.zeros(0, np.int64)
            )
        (self.folder / "paths.json").write_text(json.dumps({"source": self.source, "category": self.category,
                                                           "paths": list(self._paths), "sites": list(self._sites)},
                                                          ensure_ascii=False),
                                                encoding="utf-8")
        return len(self._columns["record"])


class DocReader:
    """A finished store, read in order (:meth:`__iter__`) or by row (:meth:`document`)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        head = json.loads((folder / "paths.json").read_text(encoding="utf-8"))
        self.source, self.category, self.paths = head["source"], head["category"], head["paths"]
        self.sites = head.get("sites", [""])  # a store written before sites were kept: none known
        self._offsets = {name: np.load(folder / f"{name}.offsets.npy", mmap_mode="r") for name in ("text", "ids")}
        self.columns = {name: np.load(folder / f"{name}.npy", mmap_mode="r") for name in _COLUMNS
                        if name != "site_index" or (folder / f"{name}.npy").is_file()}
        self.columns.setdefault("site_index", np.zeros(len(self.columns["record"]), np.int64))

    def __len__(self) -> int:
        return len(self.columns["record"])

    def _string(self, name: str, row: int) -> str:
        start, end = int(self._offsets[name][row]), int(self._offsets[name][row + 1])
        with open(self.folder / f"{name}.bin", "rb") as fh:
            fh.seek(start)
            return fh.read(end - start).decode("utf-8")

    def origin(self, row: int) -> dict[str, str | int]:
        """Where document ``row`` came from, as :meth:`Document.origin` gives it."""
        return {"source": self.source, "path": self.paths[int(self.columns["path_index"][row])],
                "record": int(self.columns["record"][row])}

    def document(self, row: int) -> Document:
        origin = self.origin(row)
        return Document(self._string("text", row), self._string("ids", row), self.source, self.category,
                        str(origin["path"]), int(origin["record"]), self.sites[int(self.columns["site_index"][row])])

    def text(self, row: int) -> str:
        return self._string("text", row)

    def doc_id(self, row: int) -> str:
        return self._string("ids", row)

    def __iter__(self) -> Iterator[tuple[int, Document]]:
        """``(ordinal, document)`` in store order, read sequentially."""
        offsets = {name: np.asarray(self._offsets[name]) for name in ("text", "ids")}
        path_index, record, ordinal, site_index = (np.asarray(self.columns[name]) for name in _COLUMNS)
        with open(self.folder / "text.bin", "rb") as text, open(self.folder / "ids.bin", "rb") as ids:
            for row in range(len(self)):
                body = text.read(int(offsets["text"][row + 1] - offsets["text"][row])).decode("utf-8")
                doc_id = ids.read(int(offsets["ids"][row + 1] - offsets["ids"][row])).decode("utf-8")
                yield int(ordinal[row]), Document(body, doc_id, self.source, self.category,
                                                  self.paths[int(path_index[row])], int(record[row]),
                                                  self.sites[int(site_index[row])])
