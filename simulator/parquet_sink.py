"""Write a run to ``events.parquet``, ``status.parquet``, ``truth.parquet`` and ``devices.parquet``.

Tables are buffered into row groups of up to ROW_GROUP rows, so memory stays
bounded; each file is written under a temporary name and renamed into place on
close, so no half-written file is ever visible.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROW_GROUP = 262_144


class ParquetSink:
    def __init__(self, out_dir: str | os.PathLike[str]) -> None:
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._writers: dict[str, pq.ParquetWriter] = {}
        self._buffers: dict[str, list[pa.Table]] = {}
        self._schemas: dict[str, pa.Schema] = {}

    def path(self, kind: str) -> Path:
        return self.out_dir / f"{kind}.parquet"

    def _temp(self, kind: str) -> Path:
        return self.out_dir / f".{kind}.parquet.partial"

    def write(self, kind: str, table: pa.Table) -> None:
        self._schemas.setdefault(kind, table.schema)
        buffer = self._buffers.setdefault(kind, [])
        buffer.append(table)
        if sum(t.num_rows for t in buffer) >= ROW_GROUP:
            self._flush(kind)

    def _flush(self, kind: str) -> None:
        buffer = self._buffers.get(kind)
        if not buffer:
            return
        if kind not in self._writers:
            self._writers[kind] = pq.ParquetWriter(self._temp(kind), self._schemas[kind], compression="zstd")
        self._writers[kind].write_table(pa.concat_tables(buffer), row_group_size=ROW_GROUP)
        buffer.clear()

    def close(self) -> None:
        for kind in list(self._buffers):
            self._flush(kind)
        for kind, writer in self._writers.items():
            writer.close()
            os.replace(self._temp(kind), self.path(kind))
        self._writers.clear()
