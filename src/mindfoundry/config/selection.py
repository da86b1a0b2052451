"""Step (and rank) selections written as ``"1|50-100"``: single numbers and inclusive ranges joined by ``|``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Selection:
    """A set of non-negative integers given as inclusive ranges; empty text selects nothing."""

    text: str
    ranges: tuple[tuple[int, int], ...]

    def __contains__(self, value: int) -> bool:
        return any(lo <= value <= hi for lo, hi in self.ranges)

    @property
    def last(self) -> int | None:
        return max((hi for _, hi in self.ranges), default=None)

    def __bool__(self) -> bool:
        return bool(self.ranges)


def parse_selection(text: str, what: str = "steps") -> Selection:
    """Parse ``"1|50-100"``; raise ValueError saying what is wrong and what a valid value looks like."""
    ranges = []
    for part in (p.strip() for p in str(text).split("|")):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise ValueError(f"{what} '{text}': '{part}' is not a number or a range like '50-100' "
                             f"(write e.g. '1|50-100')") from None
        if a < 0 or b < a:
            raise ValueError(f"{what} '{text}': range '{part}' must be non-negative and ascending (e.g. '50-100')")
        ranges.append((a, b))
    return Selection(str(text), tuple(ranges))
