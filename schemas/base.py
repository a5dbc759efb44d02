"""Declarative record definitions: one field spec gives validation, JSON, Arrow and JSON Schema.

A record is a frozen, keyword-only dataclass deriving from :class:`Record` whose
fields are declared with :func:`ident`, :func:`integer`, :func:`number`,
:func:`flag` or :func:`records`. Constructing a record validates it, so an
invalid record cannot exist in memory; :mod:`schemas.codec` and
:mod:`schemas.arrow` only translate between representations.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import functools
from types import SimpleNamespace
from typing import Any, Callable, ClassVar

import numpy as np

from schemas.errors import ValidationError

MAX_ID_CHARS = 128
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class Kind(enum.Enum):
    ID = "id"  # printable identifier string (str.isprintable: no control, format, separator
    #              other than ASCII space, surrogate, private-use or unassigned characters)
    INT = "int"  # int64
    FLOAT = "float"  # finite float64
    BOOL = "bool"
    RECORDS = "records"  # list of nested records


@dataclasses.dataclass(frozen=True)
class Spec:
    """How one field is typed and bounded. ``max_len`` bounds id chars or list items."""

    kind: Kind
    doc: str
    unit: str | None = None
    nullable: bool = False
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    max_len: int | None = None
    item: type["Record"] | None = None

    def check(self, name: str, value: Any) -> Any:
        """Return ``value`` normalized to the field's Python type, or raise ValidationError."""
        if value is None:
            if self.nullable:
                return None
            raise ValidationError(name, value, "required field is null")
        return _CHECKS[self.kind](self, name, value)


def _check_id(spec: Spec, name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ValidationError(name, value, "expected a string")
    if not value:
        raise ValidationError(name, value, "must not be empty")
    limit = spec.max_len or MAX_ID_CHARS
    if len(value) > limit:
        raise ValidationError(name, value, f"longer than {limit} characters")
    if value != value.strip():
        raise ValidationError(name, value, "leading or trailing whitespace")
    if not value.isprintable():
        char = next(c for c in value if not c.isprintable())
        raise ValidationError(name, value, f"non-printable character U+{ord(char):04X}")
    return value


def _check_bounds(spec: Spec, name: str, value: float) -> None:
    if spec.ge is not None and not value >= spec.ge:
        raise ValidationError(name, value, f"must be >= {spec.ge}")
    if spec.gt is not None and not value > spec.gt:
        raise ValidationError(name, value, f"must be > {spec.gt}")
    if spec.le is not None and not value <= spec.le:
        raise ValidationError(name, value, f"must be <= {spec.le}")


def _check_int(spec: Spec, name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(name, value, "expected an integer")
    if not INT64_MIN <= value <= INT64_MAX:
        raise ValidationError(name, value, "outside the int64 range")
    _check_bounds(spec, name, value)
    return int(value)


def _check_float(spec: Spec, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValidationError(name, value, "expected a number")
    if isinstance(value, int) and abs(value) > 2**53:
        raise ValidationError(name, value, "integer too large to be an exact float")
    value = float(value)
    if not math.isfinite(value):
        raise ValidationError(name, value, "must be finite (no NaN or infinity)")
    _check_bounds(spec, name, value)
    return value


def _check_bool(spec: Spec, name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValidationError(name, value, "expected true or false")
    return value


def _check_records(spec: Spec, name: str, value: Any) -> tuple["Record", ...]:
    assert spec.item is not None
    if not isinstance(value, (list, tuple)):
        raise ValidationError(name, value, "expected a list")
    if spec.max_len is not None and len(value) > spec.max_len:
        raise ValidationError(name, len(value), f"more than {spec.max_len} items")
    items = []
    for index, item in enumerate(value):
        try:
            items.append(item if isinstance(item, spec.item) else spec.item.from_dict(item))
        except ValidationError as error:
            raise error.under(f"{name}.{index}") from None
    return tuple(items)


_CHECKS = {
    Kind.ID: _check_id,
    Kind.INT: _check_int,
    Kind.FLOAT: _check_float,
    Kind.BOOL: _check_bool,
    Kind.RECORDS: _check_records,
}


def _field(spec: Spec) -> Any:
    default = None if spec.nullable else dataclasses.MISSING
    return dataclasses.field(default=default, metadata={"spec": spec})


def ident(doc: str, *, nullable: bool = False) -> Any:
    """A printable identifier of at most MAX_ID_CHARS characters."""
    return _field(Spec(Kind.ID, doc, nullable=nullable))


def integer(doc: str, *, unit: str | None = None, ge: int | None = None, nullable: bool = False) -> Any:
    return _field(Spec(Kind.INT, doc, unit=unit, ge=ge, nullable=nullable))


def number(
    doc: str,
    *,
    unit: str | None = None,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    nullable: bool = False,
) -> Any:
    """A finite float64 with optional bounds."""
    return _field(Spec(Kind.FLOAT, doc, unit=unit, ge=ge, gt=gt, le=le, nullable=nullable))


def flag(doc: str, *, nullable: bool = False) -> Any:
    return _field(Spec(Kind.BOOL, doc, nullable=nullable))


def records(item: type["Record"], doc: str, *, max_len: int) -> Any:
    return _field(Spec(Kind.RECORDS, doc, item=item, max_len=max_len))


def absent(value: Any) -> Any:
    """True where a nullable field is null: ``None`` for one record, NaN in a batch's float column."""
    return np.isnan(value) if isinstance(value, np.ndarray) else value is None


def true(value: Any) -> Any:
    """True where a nullable flag is set (null counts as not set), for one record or a batch column."""
    return value == 1 if isinstance(value, np.ndarray) else bool(value)


@dataclasses.dataclass(frozen=True)
class Rule:
    """A rule across fields, declared once and evaluated on one record or on a whole batch.

    ``violated`` reads fields as attributes: Python values of one record, or numpy columns of a
    batch (strings as object arrays, floats and flags as float64 with NaN for null); it must use
    only operations valid for both (``==``, ``np.logical_*``, :func:`absent`, :func:`true`).
    """

    field: str  # the field an error names
    rule: str
    violated: Callable[[Any], Any]


class Record:
    """Base of every wire record. Subclasses are ``@dataclass(frozen=True, kw_only=True)``."""

    NAME: ClassVar[str]
    SCHEMA_VERSION: ClassVar[int] = 1
    DOC: ClassVar[str] = ""
    RULES: ClassVar[tuple[Rule, ...]] = ()  # checked in order; the first violated one is reported

    def __post_init__(self) -> None:
        for name, spec in specs(type(self)):
            object.__setattr__(self, name, spec.check(name, getattr(self, name)))
        self.check_rules()

    def check_rules(self) -> None:
        """Rules across fields (:attr:`RULES`, then any a record adds); raise ValidationError."""
        for rule in self.RULES:
            if rule.violated(self):
                raise ValidationError(rule.field, getattr(self, rule.field), rule.rule)

    @classmethod
    def batch_violations(cls, batch: Any) -> np.ndarray:
        """(count,) True where a record of ``batch`` (a :class:`schemas.columnar.Columns`) may break a rule across
        fields: :attr:`RULES` on whole columns here; a record class with rules of its own adds them. The records
        flagged are made one by one, whose construction decides and names the rule."""
        view = SimpleNamespace()
        for name, spec in specs(cls):
            value = batch.values[name]
            if isinstance(value, np.ndarray) and value.dtype == object and spec.kind is not Kind.ID:
                value = np.array([np.nan if v is None else float(v) for v in value.tolist()])  # NaN for null
            setattr(view, name, value)
        bad = np.zeros(batch.count, bool)
        for rule in cls.RULES:
            bad |= np.broadcast_to(np.asarray(rule.violated(view), bool), bad.shape)
        return bad

    @classmethod
    def from_dict(cls, obj: Any) -> "Record":
        """Validate a decoded JSON object (without ``schema_version``) into a record."""
        if not isinstance(obj, dict):
            raise ValidationError("<record>", obj, f"expected a JSON object for {cls.NAME}")
        known = _spec_map(cls)
        for key in obj:
            if key not in known:
                name = key if key and key.isprintable() else repr(key)
                raise ValidationError(name, obj[key], f"unknown field for {cls.NAME}")
        for name, spec in known.items():
            if name not in obj and not spec.nullable:
                raise ValidationError(name, None, "required field is missing")
        return cls(**obj)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values, nested records as dicts, without ``schema_version``."""
        out: dict[str, Any] = {}
        for name, spec in specs(type(self)):
            value = getattr(self, name)
            out[name] = [item.to_dict() for item in value] if spec.kind is Kind.RECORDS else value
        return out


@functools.cache
def _spec_map(cls: type[Record]) -> dict[str, Spec]:
    return dict(specs(cls))


@functools.cache
def specs(cls: type[Record]) -> tuple[tuple[str, Spec], ...]:
    """The (name, spec) of each field of a record class, in declaration order."""
    return tuple((field.name, field.metadata["spec"]) for field in dataclasses.fields(cls))  # type: ignore[arg-type]
