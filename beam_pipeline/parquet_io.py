"""A Parquet source for the job: the same transforms over recorded events, without a broker.

Files are read in record batches of up to ``max_batch`` rows, emitted as :class:`TableBatch`
elements that the parse step validates column-wise (:func:`schemas.batch.validate_table`). Row
numbers stand in for offsets in dead letters. Used by ``bench/pipeline_bench.py`` and for replays
of recorded logs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


@dataclass(frozen=True)
class TableBatch:
    """Consecutive rows of one file, already columnar."""

    topic: str  # "parquet:<path>", for dead letters
    partition: int
    offsets: np.ndarray  # (n,) row numbers in the file
    table: pa.Table
    new_from: int = 0


SEEN = 2**62  # new_from for rows an earlier cycle already read: state only, not counted or dead-lettered


class ReadBatches(beam.DoFn):
    def __init__(self, max_batch: int, seen: bool) -> None:
        self.max_batch, self.new_from = max_batch, SEEN if seen else 0

    def process(self, path: str) -> Iterator[TableBatch]:
        row = 0
        for batch in pq.ParquetFile(path).iter_batches(batch_size=self.max_batch):
            table = pa.Table.from_batches([batch])
            yield TableBatch(f"parquet:{path}", 0, np.arange(row, row + table.num_rows, dtype=np.int64), table,
                             self.new_from)
            row += table.num_rows


class ReadParquet(beam.PTransform):
    """Parquet files -> TableBatch elements."""

    def __init__(self, paths: list[str], max_batch: int = 20_000, seen: bool = False) -> None:
        super().__init__()
        self.paths, self.max_batch, self.seen = paths, max_batch, seen

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        return (pbegin | "Files" >> beam.Create(self.paths) | "Reshuffle" >> beam.Reshuffle()
                | "Batches" >> beam.ParDo(ReadBatches(self.max_batch, self.seen)))
