"""The base of every config section."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """Base for all sections: unknown keys are errors (they are almost always typos)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

