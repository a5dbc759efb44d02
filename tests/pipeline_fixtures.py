"""Shared by the pipeline tests: a small simulated run in memory, a checkpoint of an untrained model, and a
sink that keeps a pipeline's outputs as files (the runners may run DoFns in other processes)."""

from __future__ import annotations

import pickle
import uuid
from dataclasses import replace
from pathlib import Path

import apache_beam as beam

import numpy as np
import pyarrow as pa
import torch
from apache_beam.utils.timestamp import Timestamp

from beam_pipeline.options import JobConfig
from model.bm import BM
from model.candidates import Pieces
from model.checkpoint import save
from model.config import RankingConfig
from model.evidence import memories
from model.graphs import DeviceIndex
from simulator.config import SimConfig
from simulator.engine import MemorySink, Simulator
from simulator.world import device_ids
from tests.test_bm import SMALL

SIM = SimConfig(devices=30, tasks=360, slots=8, seed=5, telemetry=True)  # statuses carry the load
RANKING = RankingConfig(range_m=400.0, top_k=5, scores_per_owner=6)
PIECES = Pieces(3, cell_m=1.0)  # cells of 2 x range = 800 m: the 1 km square spans 4, on 3 pieces


def run_tables(config: SimConfig = SIM) -> tuple[pa.Table, pa.Table]:
    """(events, status) of a simulated run, in memory, as the Parquet sink would write them."""
    memory = MemorySink()
    Simulator(config).run([memory])
    return memory["events"], memory["status"]


def write_checkpoint(directory: Path, config: SimConfig = SIM, reads_y: bool = True) -> Path:
    """An untrained (seeded) model over the run's devices, every weight perturbed so that every input
    matters (the head's Y weights start at zero), its size correction adopted: parity needs no training. ``reads_y``
    False: the head's Y weights zeroed again, as a head kept from the warm-up has them (the model uses no encoder).
    Where owners report the run's tasks, the head reads what was reported and not believed, and where statuses carry
    the load the evidence also keeps the long memory, watches the loads for shifts and fits their cycles, as training
    makes them; its size evidence parts tasks at the nominal (median) size, where training would part sizes that vary
    (where every task has that size, all are of one class)."""
    torch.manual_seed(0)
    features = np.random.default_rng(0).normal(size=(config.devices, SMALL.node2vec.dim)).astype(np.float32)
    evidence = replace(SMALL.evidence, lams=memories(SMALL.evidence.lams, config.telemetry),
                       discredited=config.owner_reports > 0, size_split_bits=config.task_size_bits,
                       shifts=config.telemetry, cycles=config.telemetry)
    model = BM(replace(SMALL, clock=config.clock, evidence=evidence), features)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
        if not reads_y:
            forget_y(model)
    model.head.sizing.adopt(lam_index=1, strength=2.0, prior_mean=0.7, ridge=1.0)
    save(model, DeviceIndex(tuple(device_ids(config.devices).to_pylist())), directory)
    return directory


def forget_y(model: BM) -> None:
    """Zero the Y columns of every head member's networks (in place)."""
    with torch.no_grad():
        for member in model.head.members:
            for net in (member.behaviour, member.median):
                if net is not None:
                    net[0].weight[:, : model.head.y_width].zero_()


def job(checkpoint: Path, **changes) -> JobConfig:
    return JobConfig(str(checkpoint), **{"shards": 3, "pieces": PIECES, "lateness_slots": 1, "ranking": RANKING,
                                         **changes})


def at(ms: float) -> Timestamp:
    """A Beam timestamp from epoch milliseconds."""
    return Timestamp(micros=int(ms) * 1000)


class Keep(beam.DoFn):
    """Writes each element to its own pickle file in ``directory``."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def process(self, element) -> None:
        Path(self.directory, uuid.uuid4().hex).write_bytes(pickle.dumps(element))


def kept(directory: Path) -> list:
    """What :class:`Keep` wrote to ``directory``."""
    return [pickle.loads(p.read_bytes()) for p in sorted(directory.iterdir())]


def whole_slots(pieces: list) -> list:
    """SlotScores of a pipeline (each slot in pieces, each publication numbered by revision) joined per slot and
    revision, in (slot, revision) order; pieces without records say nothing and are left out."""
    from model.published import SlotScores

    groups: dict[tuple[int, int], list] = {}
    for piece in pieces:
        records = piece.scores or piece.rankings
        if records:
            groups.setdefault((piece.slot, records[0].revision), []).append(piece)
    return [SlotScores.join(groups[key]) for key in sorted(groups)]
