"""trustbeam's wire schemas: one definition per record gives validation, JSON, Arrow and JSON Schema.

The ground floor: imports no other trustbeam package.

>>> from schemas import CollaborationEvent, to_json, from_json
>>> event = CollaborationEvent(event_id="e1", event_time_ms=0, owner="a", collaborator="b", reliability=0.9)
>>> from_json(CollaborationEvent, to_json(event)) == event
True
"""

from schemas.arrow import arrow_schema, events_file_schema, from_arrow, to_arrow
from schemas.base import Record
from schemas.columnar import Columns, Nested
from schemas.codec import MAX_MESSAGE_BYTES, from_json, from_json_forward, to_json
from schemas.errors import ValidationError
from schemas.records import (
    WIRE_RECORDS,
    CollaborationEvent,
    CollaboratorRanking,
    DeviceStatus,
    RankedCandidate,
    TrustScore,
)

__all__ = [
    "MAX_MESSAGE_BYTES",
    "Nested",
    "WIRE_RECORDS",
    "CollaborationEvent",
    "CollaboratorRanking",
    "Columns",
    "DeviceStatus",
    "RankedCandidate",
    "Record",
    "TrustScore",
    "ValidationError",
    "arrow_schema",
    "events_file_schema",
    "from_arrow",
    "from_json",
    "from_json_forward",
    "to_arrow",
    "to_json",
]
