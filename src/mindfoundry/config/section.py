"""The base of every config section, and the bounds every value shares."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator

#: Every integer in a config stays within what a float64 (JSON, metrics, YAML round trips) holds exactly;
#: fields with tighter meaning set their own bounds.
MAX_INT = 2**53


#: A path we write under: each part must leave room for the suffixes we add (``.tmp-step_00000012-4711``)
#: within the 255 bytes a file name may have; the whole within what every OS accepts.
MAX_PATH_PART = 200
MAX_PATH = 1024


_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")


def url_protocol(path: str) -> str | None:
    """The URL scheme of a path from the config (``s3`` for ``s3://bucket/key``), or None for a local path (``file://``
    counts as local): the one rule for what a URL is (mindfoundry.storage reaches them)."""
    found = _SCHEME.match(path)
    if found is None or found.group(1).lower() == "file":
        return None
    return found.group(1).lower()


def checked_path(value: str | None) -> str | None:
    """``value`` if it is a usable output path, else ValueError saying what is wrong with it."""
    if value is None:
        return value
    if not value.strip():
        raise ValueError("an empty path: give a folder, or null for the default")
    if any(ord(c) < 32 for c in value):
        raise ValueError("holds a control character (NUL, newline, ...): no file system path should")
    if len(value.encode()) > MAX_PATH:
        raise ValueError(f"is {len(value.encode())} bytes long: at most {MAX_PATH}")
    longest = max(value.replace("\\", "/").split("/"), key=lambda part: len(part.encode()))
    if len(longest.encode()) > MAX_PATH_PART:
        raise ValueError(f"has a {len(longest.encode())}-byte folder name: at most {MAX_PATH_PART} "
                         f"(the file system allows 255, and the tool appends suffixes)")
    return value


class Section(BaseModel):
    """Base for all sections: unknown keys are errors (they are almost always typos); floats must be
    finite (an infinite learning rate or init std only turns every step into NaN); integers bounded."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _bounded_int(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
            raise ValueError(f"integers in a config must be within ±2**53 ({MAX_INT:,}); this one is {value:.3e}")
        return value
