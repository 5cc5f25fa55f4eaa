"""What every spec model shares: the strict base model, names, and sizes, rates and times
written in human units (fabric_emu.spec.units)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, GetJsonSchemaHandler

from fabric_emu.spec import units

NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
NAME_HELP = "1-64 characters: letters, digits, '_', '.', '-', starting with a letter or digit"


def _unit(parser, help_text):
    def convert(v: Any) -> Any:
        try:
            return parser(v)
        except ValueError:
            raise ValueError(f"got {v!r} ({help_text})") from None

    return BeforeValidator(convert)


class _Written:
    """The JSON schema of a value in human units: the number (with the field's bounds), or a
    string the parser takes, as a spec file may write it."""

    def __init__(self, pattern: str, help_text: str):
        self.pattern, self.help_text = pattern, help_text

    def __get_pydantic_json_schema__(self, schema: Any, handler: GetJsonSchemaHandler) -> dict:
        return {"anyOf": [handler(schema), {"type": "string", "pattern": self.pattern, "description": self.help_text}]}


Bytes = Annotated[int, _unit(units.parse_size, units.SIZE_HELP), _Written(units.SIZE_PATTERN, units.SIZE_HELP)]
Rate = Annotated[float, _unit(units.parse_rate_bps, units.RATE_HELP), _Written(units.RATE_PATTERN, units.RATE_HELP)]
Seconds = Annotated[float, _unit(units.parse_time_s, units.TIME_HELP), _Written(units.TIME_PATTERN, units.TIME_HELP)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False, frozen=True)


HostName = Annotated[str, Field(pattern=NAME_RE)]
JobName = Annotated[str, Field(pattern=NAME_RE)]
