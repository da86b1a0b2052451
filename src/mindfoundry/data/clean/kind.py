"""What a document is, read from the document itself: source code, structured reference text, or prose.

The ``auto`` cleaning profile asks this per document (:func:`document_kind`), because a source's name
says little: a "manual" category holds prose chapters, a "wiki" one holds API pages, and a code
repository holds READMEs. The kinds decide which rules are fair:

- ``code``: most lines are code (prompts, brackets, ``=``, ``;``, indentation-led statements). Only
  what cannot damage source code applies (mojibake, control characters, length).
- ``docs``: reference text with visible structure: headings (numbered ``3.12. Paste as``, reST
  underlines, Markdown ``#``, man-page section names), option lists (``-a, --all``), markup
  (``.. function::``, ``:func:``), code lines and table rules. It names its subject and repeats
  formulas by design, so repetition limits are those of reference text and lines shared between
  pages are content.
- ``prose``: everything else (news, reviews, books, poems, forum posts): every rule applies.

The decision counts lines, so it costs one pass of compiled regular expressions per document.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Literal

from mindfoundry.config.clean import JunkConfig
from mindfoundry.data.clean.garbled import is_table_rule
from mindfoundry.data.clean.junk import garbled_word_ratio
from mindfoundry.data.clean.quality import is_syntax_line

Kind = Literal["code", "docs", "prose"]
KINDS: tuple[Kind, ...] = ("code", "docs", "prose")

#: Share of non-blank lines that must be code for a document to be code.
CODE_LINE_SHARE = 0.4
#: Share of non-blank lines that must be structure (headings, options, markup, code, tables) for reference text.
STRUCTURE_LINE_SHARE = 0.12
#: Code's identifiers are words: text with more garbled words than the junk block allows is not code.
GARBLED_WORD_RATIO = JunkConfig.model_fields["max_garbled_word_ratio"].default
#: A longer document is judged on runs of SAMPLE_RUN consecutive lines spread evenly, about SAMPLE_LINES in all
#: (consecutive, so a docstring's quotes still open and close within a run).
SAMPLE_LINES, SAMPLE_RUN = 1200, 40
#: Fewer non-blank lines than this say too little: such a document is prose (a one-line review, a quote).
MIN_LINES = 8

_STRUCTURE = re.compile(
    r"^\s*(?:"
    r"\d+(?:\.\d+)+\.?\s+\S"  # numbered heading: 3.12. Paste as / 10.1.1 存档
    r"|#{1,6}\s+\S"  # Markdown heading
    r"|([=\-~^\"'`*+#])\1{3,}\s*$"  # reST underline or a rule line
    r"|\.\.\s+[\w:-]+::"  # reST directive
    r"|-{1,2}[A-Za-z0-9][\w-]*(?:[ ,=\[]|$)"  # option: -a, --all, --size=SIZE
    r"|(?:NAME|SYNOPSIS|DESCRIPTION|OPTIONS|EXAMPLES?|SEE ALSO|FILES|ENVIRONMENT|AUTHORS?|BUGS|EXIT STATUS"
    r"|RETURN VALUE|NOTES|COPYRIGHT|HISTORY|ERRORS|COMMANDS|USAGE)\s*$"  # man-page sections
    r"|[|+\u2500-\u257f]"  # a table row or rule
    r"|(?:名称|名字|概述|大纲|描述|选项|参数|示例|范例|返回值|另见|参见|注意|文件|环境|作者|错误|总览|语法|用法)\s*$"
    r"|第\s*\d+\s*[章节]"  # 第 8 章
    r"|(?:图|表|Figure|Table|Example|例)\s*\d+(?:\.\d+)*"  # a caption: 图 14.53. / Table 3.1
    # a definition: Pressure: ... / 参数：...
    r"|(?:[A-Za-z][\w()/-]*(?: [\w()/-]+){0,3}|[\u4e00-\u9fff]{1,12})\s*[:：]\s+\S"
    r"|[A-Za-z_][\w.]*\([\w ,.*=\[\]'\"-]*\)\s*$"  # a signature line: os.path.join(path, *paths)
    r")"
)
_ROLE = re.compile(r":[a-z]+:`")  # reST roles (:func:`os.path`) inside prose lines
_KEYWORD = (
    r"def|class|return|import|from\s+[\w.]+\s+import|if|elif|else|for|while|try|except|finally|with|raise|yield|pass"
    r"|break|continue|assert|lambda|async|await|const|let|var|function|public|private|protected|static|void|int|char"
    r"|unsigned|struct|typedef|package|func|fn|use|impl|switch|case|do|end|local|my|sub|#include|#define|@\w+"
)
# A line of source code: a statement keyword first, or a statement's shape (ends opening or closing a block, an
# assignment or call); written in ASCII (a comment or string literal in Chinese aside).
_CODE_LINE = re.compile(
    rf"^\s*(?:(?:{_KEYWORD})\b.*|>>>.*|[}})\]].*|.*[{{;(\[]\s*|.*\b\w+(?:\[[^\]]*\])?\s*[-+*/|&]?=\s*\S.*"
    r"|.*\w\(.*\)\s*)$"
)
_NON_ASCII = re.compile(r"[^\x00-\x7f]")
_TRACEBACK = re.compile(r"^\s*(?:Traceback \(most recent call last\):|File \".*\", line \d+|\w+(?:Error|Exception):)")


_TRAILING_COMMENT = re.compile(r"\s+(?:#|//)(?:\s.*)?$")
# A line of data in code: literals (a quoted string, a number), optionally a key and a value, a trailing comma.
_LITERAL = (
    r"(?:[rbuf]?'(?:[^'\\]|\\.)*'|[rbuf]?\"(?:[^\"\\]|\\.)*\"|-?(?:0[xob])?[\da-fA-F_.]+[jJlL]?|None|True|False|null)"
)
_DATA_LINE = re.compile(rf"^\s*{_LITERAL}(?:\s*:\s*{_LITERAL})?\s*,?\s*$")


# Every code or data line holds one of these or starts with a keyword or a bare literal: a line without them is
# prose, decided without the slower patterns (most lines of most documents).
_CODE_HINT = re.compile(r"[{}()\[\];=>\"'0-9]")
_CODE_START = re.compile(rf"^\s*(?:{_KEYWORD}|None|True|False|null)\b")


@lru_cache(maxsize=1 << 16)  # documents of a corpus share many lines, and several blocks ask about each
def is_code_line(line: str) -> bool:
    """Whether a line reads as source code (:data:`_CODE_LINE`, or a line of literals such as a codec table's
    ``0x0080: 0x00c7,``), a trailing comment aside, with at most a fifth of it outside ASCII."""
    code = _TRAILING_COMMENT.sub("", line) if "#" in line or "//" in line else line
    if _CODE_HINT.search(code) is None and _CODE_START.match(code) is None:
        return False
    if not code.strip() or len(_NON_ASCII.findall(line)) > len(line) // 5:
        return False
    return _CODE_LINE.match(code) is not None or _DATA_LINE.match(code) is not None


def _code_lines(lines: list[str]) -> int:
    """How many of ``lines`` are code: code lines, and the lines of triple-quoted strings (docstrings belong to the
    code they document)."""
    count, quoted = 0, False
    for line in lines:
        quotes = line.count('"""') + line.count("'''")
        count += quoted or quotes > 0 or is_code_line(line)
        quoted ^= quotes % 2 == 1
    return count


_STRING = re.compile(r"\"((?:[^\"\\]|\\.){2,})\"|'((?:[^'\\]|\\.){2,})'")
_COMMENT = re.compile(r"(?:^|\s)(?:#|//|/\*|--|;)\s*(.*?)(?:\*/)?$")


def written_part(text: str) -> str:
    """What people wrote in their language in a code document: its lines that are not code (comments, docstrings,
    prose between the code), and the comments and string literals of its code lines. A document of prose that reads
    as code (release notes whose lines end in ``;``, prose with shell snippets) keeps its prose."""
    parts = []
    for line in text.split("\n"):
        if not is_code_line(line):
            parts.append(line)
            continue
        parts += [a or b for a, b in _STRING.findall(line)]
        if (comment := _COMMENT.search(line)) is not None:
            parts.append(comment.group(1))
    return "\n".join(part for part in parts if part.strip())


def is_content_line(line: str) -> bool:
    """Whether a line is content wherever it repeats: code (an import, a statement, a traceback line), markup, a
    heading, an option or a table rule (not merely a line with symbols: a breadcrumb "文档 > 指南" is not). Boilerplate
    removal never deletes such a line, however many documents share it."""
    return (_STRUCTURE.match(line) is not None or _TRACEBACK.match(line) is not None or is_table_rule(line)
            or is_code_line(line))  # the cheap anchored patterns first


@lru_cache(maxsize=16)
def document_kind(text: str) -> Kind:
    """``code``, ``docs`` or ``prose``, by the share of code lines and of structure lines (module docstring)."""
    lines = [line for line in text.split("\n") if line.strip()]
    if len(lines) < MIN_LINES:
        return "prose"
    if len(lines) > SAMPLE_LINES:  # a book or a 180k-character page: evenly spaced runs of lines say what it is
        step = len(lines) // (SAMPLE_LINES // SAMPLE_RUN)
        lines = [line for start in range(0, len(lines), step) for line in lines[start:start + SAMPLE_RUN]]
    code = _code_lines(lines)
    if code >= CODE_LINE_SHARE * len(lines) and garbled_word_ratio(text)[0] <= GARBLED_WORD_RATIO:
        return "code"  # (random strings of letters and symbols have code's punctuation, not its identifiers)
    structure = sum(1 for line in lines if _STRUCTURE.match(line) or _ROLE.search(line) or is_syntax_line(line))
    return "docs" if structure >= STRUCTURE_LINE_SHARE * len(lines) else "prose"
