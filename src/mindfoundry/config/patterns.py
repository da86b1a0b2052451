"""User-supplied regular expressions, bounded in time.

A pattern from a config (``data.clean.boilerplate.ad_patterns``) can backtrack catastrophically:
``(a+)+$`` on a line of 34 ``a`` and a ``!`` runs for hours in :mod:`re`. These patterns are compiled with the
``regex`` module, whose matching takes a timeout, and a search that runs out of time raises
:class:`SlowPatternError` naming the pattern and the fix, instead of hanging ``prepare``. Validation also tries each
pattern on a few adversarial lines (:func:`probe`), so the common shapes are refused before any work starts.
"""

from __future__ import annotations

import regex

from mindfoundry.errors import MindFoundryError

#: The longest one search of one line may take (real patterns take microseconds).
SEARCH_SECONDS = 1.0
#: Lines that make nested or overlapping repeats backtrack: runs of one character with a mismatch at the end.
_PROBES = tuple(char * 30 + end for char in "a1 .x" for end in ("!", "\n", "\u0000"))
_PROBE_SECONDS = 0.05


class SlowPatternError(MindFoundryError, ValueError):
    """A user pattern took longer than :data:`SEARCH_SECONDS` on one line."""


def _slow(pattern: str, key: str) -> SlowPatternError:
    return SlowPatternError(
        f"{key} pattern {pattern!r} takes over {SEARCH_SECONDS:g} s on a single line: it backtracks "
        "catastrophically (nested repeats such as (a+)+ or (.*)*); rewrite it without a repeat inside "
        "a repeat, e.g. a+ instead of (a+)+"
    )


class UserPatterns:
    """Several user patterns searched as one, case-insensitive, each search bounded by :data:`SEARCH_SECONDS`."""

    def __init__(self, patterns: list[str], key: str) -> None:
        self.patterns, self.key = patterns, key
        self.compiled = regex.compile("|".join(f"(?:{p})" for p in patterns), regex.IGNORECASE | regex.VERSION0)

    def search(self, text: str) -> bool:
        """Whether any pattern matches in ``text``; SlowPatternError (naming the slow pattern) past the time limit."""
        try:
            return self.compiled.search(text, timeout=SEARCH_SECONDS) is not None
        except TimeoutError:
            raise _slow(self._slowest(text), self.key) from None

    def _slowest(self, text: str) -> str:
        for pattern in self.patterns:
            try:
                regex.search(pattern, text, regex.IGNORECASE | regex.VERSION0, timeout=SEARCH_SECONDS)
            except TimeoutError:
                return pattern
        return "|".join(self.patterns)


def probe(pattern: str, key: str) -> None:
    """Compile ``pattern`` and try it on adversarial lines: ValueError naming the key when it does not compile,
    SlowPatternError when it backtracks catastrophically."""
    try:
        compiled = regex.compile(pattern, regex.IGNORECASE | regex.VERSION0)
    except regex.error as exc:
        raise ValueError(f"{key} pattern {pattern!r} is not a valid regular expression ({exc}): escape special "
                         "characters such as ( ) [ ] ? with a backslash") from None
    for line in _PROBES:
        try:
            compiled.search(line, timeout=_PROBE_SECONDS)
        except TimeoutError:
            raise _slow(pattern, key) from None
