"""The one error type that validation raises."""

from __future__ import annotations

from typing import Any

_MAX_SHOWN = 80


class ValidationError(ValueError):
    """A record broke a rule: names the field, the offending value and the rule.

    ``field`` is a dotted path (``candidates.2.trust``) or ``<record>`` for
    rules about the whole message (not JSON, not an object, too large).
    """

    def __init__(self, field: str, value: Any, rule: str) -> None:
        self.field = field
        self.value = value
        self.rule = rule
        super().__init__(f"{field}: {rule} (got {_shown(value)})")

    def under(self, prefix: str) -> "ValidationError":
        """The same error with its field path placed under ``prefix``."""
        return ValidationError(f"{prefix}.{self.field}", self.value, self.rule)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."
