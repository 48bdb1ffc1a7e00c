"""The building blocks of every scenario block, shared by the schema and the plug-ins that define their
own config models (schedules): the frozen base model and the bounded number types. Imports nothing
else of rlhfsim, so a plug-in can import it without importing the schema."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

# Every count is bounded (a typo of a few zeros is an error, not an hour of simulation); the work a
# whole run would take is bounded separately (rlhfsim.sim.budget).
PositiveInt = Annotated[int, Field(ge=1, le=1_000_000)]
Count = Annotated[int, Field(ge=0, le=1_000_000)]
Tokens = Annotated[int, Field(ge=1, le=4_194_304)]
Seconds = Annotated[float, Field(ge=0, le=86_400)]


class Frozen(BaseModel):
    """A scenario block: unknown keys rejected, immutable, finite numbers only (no .inf, no .nan)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
