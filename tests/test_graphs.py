"""Slot edges and graphs against hand-computed T_col."""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pytest

from model.config import SlotClock, TrustWeights
from model.graphs import DeviceIndex, device_keys, slot_edges, slot_graphs
from schemas import CollaborationEvent, to_arrow

CLOCK = SlotClock(origin_ms=0, slot_ms=1000)


def events(*rows: tuple) -> pa.Table:
    records = []
    for k, (time_ms, owner, collab, tr, com, reliability) in enumerate(rows):
        records.append(CollaborationEvent(event_id=f"e{k}", event_time_ms=time_ms, owner=owner, collaborator=collab,
                                          tr_success=tr, com_success=com, reliability=reliability))
    return to_arrow(CollaborationEvent, records)


def test_t_col_is_the_slot_mean_of_weighted_outcomes() -> None:
    table = events((0, "a", "b", True, True, None),     # 1.0
                   (500, "a", "b", True, False, None),  # 0.6
                   (900, "a", "b", False, False, None),  # 0.0
                   (100, "c", "b", None, None, 0.25),   # graded
                   (1200, "a", "b", True, True, None))  # next slot
    edges = slot_edges(table, CLOCK, TrustWeights()).to_pylist()
    assert [(e["slot"], e["owner"], e["collaborator"], e["tasks"]) for e in edges] == [
        (0, "a", "b", 3), (0, "c", "b", 1), (1, "a", "b", 1)]
    assert edges[0]["t_col"] == pytest.approx((1.0 + 0.6 + 0.0) / 3)
    assert edges[0]["offset"] == pytest.approx((0 + 0.5 + 0.9) / 3)
    assert edges[1]["t_col"] == pytest.approx(0.25)
    assert edges[2]["t_col"] == pytest.approx(1.0)


def test_weights_are_configurable() -> None:
    edges = slot_edges(events((0, "a", "b", True, False, None)), CLOCK, TrustWeights(a_tr=0.2, a_com=0.8))
    assert edges["t_col"].to_pylist() == pytest.approx([0.2])


def test_graphs_index_devices_and_split_by_slot() -> None:
    table = events((0, "a", "b", True, True, None), (10, "c", "a", True, False, None),
                   (2500, "b", "c", False, False, None))
    edges = slot_edges(table, CLOCK, TrustWeights())
    index = DeviceIndex.from_edges(edges)
    assert index.ids == ("a", "b", "c")
    graphs = slot_graphs(edges, index)
    assert sorted(graphs) == [0, 2]
    assert graphs[0].src.tolist() == [0, 2] and graphs[0].dst.tolist() == [1, 0]
    assert graphs[0].t_col.tolist() == pytest.approx([1.0, 0.6])
    assert graphs[0].active.tolist() == [0, 1, 2]
    only_ab = DeviceIndex(("a", "b"))
    assert only_ab.lookup(pa.array(["b", "zz"])).tolist() == [1, -1]
    assert [len(g.src) for g in slot_graphs(edges, only_ab).values()] == [1]


def test_simulated_edges_match_the_truth_table_shape(tmp_path) -> None:
    from simulator.config import SimConfig
    from simulator.engine import Simulator
    from simulator.parquet_sink import ParquetSink
    import pyarrow.parquet as pq

    config = SimConfig(devices=80, tasks=2000, slots=10)
    Simulator(config).run([ParquetSink(tmp_path)])
    edges = slot_edges(pq.read_table(tmp_path / "events.parquet"), config.clock, config.weights)
    truth = pq.read_table(tmp_path / "truth.parquet")
    assert edges.num_rows == truth.num_rows and int(np.sum(edges["tasks"])) == 2000
    assert set(zip(edges["slot"].to_pylist(), edges["owner"].to_pylist(), edges["collaborator"].to_pylist())) == \
        set(zip(truth["slot"].to_pylist(), truth["owner"].to_pylist(), truth["collaborator"].to_pylist()))


def test_device_keys_are_the_first_63_bits_of_blake2b_and_never_change() -> None:
    """Stored state and the streaming job key devices by them: a change would orphan every device's record."""
    names = ["dev-0", "\u00e9", "a" * 128, "dev-0"]
    keys = device_keys(names)
    assert keys.dtype == np.int64
    assert keys.tolist() == [int.from_bytes(hashlib.blake2b(n.encode(), digest_size=8).digest(), "little") >> 1
                             for n in names]
    assert keys[:3].tolist() == [4392981826448450104, 1697006002183834981, 7857725056227586936]
    assert (device_keys(pa.array(names)) == keys).all() and len(device_keys([])) == 0
