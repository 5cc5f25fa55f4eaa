"""SpecError, the one exception of bad input, and problem_at, which places a model's error at a
field below it."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError


class SpecError(Exception):
    """One or more problems with a spec, each 'FILE: field: message'."""

    def __init__(self, problems: list[tuple[str, str, str]]):
        self.problems = problems
        super().__init__("\n".join(self.lines()))

    def lines(self) -> list[str]:
        return [f"{f}: {field}: {msg}" if field else f"{f}: {msg}" for f, field, msg in self.problems]


def problem_at(model: str, loc: tuple, msg: str, value: Any) -> ValidationError:
    """A validation error at a field below the model (senders.2), not at the model itself."""
    return ValidationError.from_exception_data(model, [InitErrorDetails(
        type=PydanticCustomError("value_error", msg),
        loc=loc, input=value)])
