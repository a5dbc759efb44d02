"""Trust scores and rankings to Parquet, partitioned by slot date, with atomic writes.

Layout under ``root`` (a local path or any URI pyarrow's filesystems open, e.g. ``gs://``, ``s3://``)::

    trust_scores/date=2026-11-22/slot-00000123-0000.parquet
    collaborator_rankings/date=2026-11-22/slot-00000123-0000.parquet

``date`` is the UTC date of the slot's start (a Hive partition: ``pyarrow.dataset.dataset(root +
"/trust_scores", partitioning="hive")`` reads it back). Each piece of a slot (the streaming job scores
a slot in pieces, ``SlotScores.piece``; the offline scorer and the local cycles write it whole, piece 0)
is one file, written under a hidden temporary name and renamed into place, so readers never see half a
file; an update of the piece (``is_update``) replaces the file the same way, so a piece has one version
on disk, the newest.
Schemas are the records' Arrow schemas from :mod:`schemas`.
"""

from __future__ import annotations

import datetime as dt
import os
import uuid
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from model.published import SlotScores
from schemas import CollaboratorRanking, Record, TrustScore, arrow_schema, to_arrow

TABLES: dict[str, type[Record]] = {"trust_scores": TrustScore, "collaborator_rankings": CollaboratorRanking}


def slot_date(slot_start_ms: int) -> str:
    return dt.datetime.fromtimestamp(slot_start_ms / 1000, tz=dt.timezone.utc).date().isoformat()


@dataclass(frozen=True)
class ParquetResults:
    """Writes each slot's results as one file per table (see the module docstring)."""

    root: str

    def write(self, result: SlotScores) -> list[str]:
        """Write (or replace) the slot's files; returns their paths. A slot with no records writes none."""
        fs, base = (pafs.FileSystem.from_uri(self.root) if "://" in self.root
                    else (pafs.LocalFileSystem(), os.path.abspath(self.root)))
        written = []
        for name, records in (("trust_scores", result.scores), ("collaborator_rankings", result.rankings)):
            if not records:
                continue
            directory = f"{base.rstrip('/')}/{name}/date={slot_date(records[0].slot_start_ms)}"
            fs.create_dir(directory, recursive=True)
            stem = f"slot-{result.slot:08d}-{result.piece:04d}"
            path = f"{directory}/{stem}.parquet"
            temporary = f"{directory}/.{stem}.{uuid.uuid4().hex}.tmp"
            try:
                with fs.open_output_stream(temporary) as stream:
                    pq.write_table(to_arrow(TABLES[name], records), stream, compression="zstd")
                fs.move(temporary, path)
            except BaseException:
                _remove_quietly(fs, temporary)
                raise
            written.append(path)
        return written


def read_results(root: str, name: str) -> pa.Table:
    """One table (``trust_scores`` or ``collaborator_rankings``) of every slot written under ``root``."""
    import pyarrow.dataset as ds

    schema = arrow_schema(TABLES[name]).append(pa.field("date", pa.string()))
    return ds.dataset(f"{root.rstrip('/')}/{name}", format="parquet", partitioning="hive", schema=schema).to_table()


def _remove_quietly(fs: pafs.FileSystem, path: str) -> None:
    try:
        fs.delete_file(path)
    except OSError:
        pass
