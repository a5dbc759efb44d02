"""The job's options: one typed :class:`JobConfig` from the command line.

The flags are declared once (:func:`add_job_arguments`) and read two ways: by Beam, as the pipeline options view
:class:`beam_pipeline.pipeline_options.TrustbeamOptions` beside Beam's own (``trustbeam run``, Flink, Dataflow), and
by a plain parser (:meth:`JobConfig.from_args`), so that what needs the job's options and no pipeline (``trustbeam
score``) does not import Beam (~2.5 s of a process's start).
"""

from __future__ import annotations

import argparse
import difflib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Iterable

import torch

from beam_pipeline import artifacts
from beam_pipeline.artifacts import CHECKPOINT_MANIFEST, ONNX_MANIFEST
from model.checkpoint import CheckpointError, load
from model.candidates import Pieces
from model.config import RankingConfig, SystemParams
from model.config import DEVICES
from model.recalibration import RecalibrationConfig
from model.stages import Stages, TorchStages, resolve_device
from exporters.kafka_client import Topics


BACKENDS = ("torch", "onnx")
MAX_AHEAD_MS = 86_400_000  # a day: events timed further past the wall clock are dead-lettered (--max_future_s)
MAX_SKEW_MS = 300_000  # how far past the wall clock a record's time may lie and still count as progress
MAX_FUTURE_S = MAX_AHEAD_MS / 1000  # a day: simulated runs publish up to hours ahead; years ahead is forged
MAX_SKEW_S = MAX_SKEW_MS / 1000
SCORE_PIECES = 1  # local runners: one key per slot (pieces add ~30 % to a local cycle and no parallelism);
# deployments set --score_pieces to their parallelism (deploy/flink, deploy/README.md)


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """Declares trustbeam's own job options on ``parser`` (Beam's, such as ``--runner``, are Beam's to declare)."""
    parser.add_argument("--checkpoint", help="model checkpoint (trustbeam train --out): a directory, or a URI "
                                             "on any filesystem Beam supports (gs://, s3://, hdfs://)")
    parser.add_argument("--model_sha256", default=None,
                        help="the checkpoint's content hash the job must run (default: the one at --checkpoint "
                             "when the job is built); a worker that finds another model there refuses it")
    parser.add_argument("--group_id", default=None,
                        help="the Kafka consumer group of a streaming job (default trustbeam-EVENTS_TOPIC)")
    parser.add_argument("--backend", choices=BACKENDS, default="torch",
                        help="where the model runs: torch (default, faster here; see bench/onnx_bench.py) "
                             "or onnx (onnxruntime on the graphs of `trustbeam export-onnx`)")
    parser.add_argument("--device", choices=DEVICES, default="auto",
                        help="where the model runs: auto = the GPU when one is visible, else the CPU")
    parser.add_argument("--model_threads", type=int, default=0,
                        help="CPU threads the model uses in each worker process (PyTorch's intra-op threads, "
                             "onnxruntime's intra_op_num_threads); 0 (default): the runtime's default, every "
                             "core, which suits the local runner's one process on an idle machine. 1 fits "
                             "runners with a worker per core (Flink task slots, Dataflow's SDK processes), and a "
                             "machine other work keeps busy (bench/pipeline_bench.py)")
    parser.add_argument("--onnx_model", help="`trustbeam export-onnx` output, a directory or URI "
                                             "(default CHECKPOINT/onnx); ONNX loads from here only")
    parser.add_argument("--parquet_out", help="also write scores and rankings to Parquet under this path or URI, "
                                              "partitioned by slot date (exporters.parquet)")
    parser.add_argument("--shards", type=int, default=4, help="device shards holding slot sequences in state")
    parser.add_argument("--score_pieces", type=int, default=SCORE_PIECES,
                        help="pieces a slot's pair scoring is split into, by space (owners by cell, with the "
                             "devices within range): keys (slot, piece) spread a slot over workers; "
                             "trustbeam score scores them on as many threads")
    parser.add_argument("--cell_m", type=float, default=Pieces.cell_m,
                        help="side of the cells that --score_pieces hashes, in metres (at least 2 x --range_m)")
    parser.add_argument("--lateness_slots", type=int, default=1,
                        help="allowed lateness, in slots: later events for a slot go to dead-letter")
    parser.add_argument("--tombstone_slots", type=int, default=64,
                        help="slots an expired slot is remembered, dead-lettering its late events; later ones "
                             "are refused by the shards (never scored)")
    parser.add_argument("--replay_through", type=int, default=None,
                        help="a bounded re-run over a log an earlier run of this job scored (a backfill; trustbeam "
                             "run's cycles set it from their ledger): slots at or below this one were published; "
                             "their records rebuild state and are not published again, and late records for "
                             "them go to dead-letter (default: off, a streaming job: slots close by the "
                             "watermark)")
    parser.add_argument("--max_future_s", type=float, default=MAX_FUTURE_S,
                        help="events timed more than this far past the processing time go to dead-letter (s)")
    parser.add_argument("--max_skew_s", type=float, default=MAX_SKEW_S,
                        help="events timed more than this far past the processing time are kept but never "
                             "advance the job's progress: a producer whose clock runs ahead cannot close "
                             "slots (s)")
    parser.add_argument("--kafka_io", choices=("python", "xlang"), default="python",
                        help="python: kafka-python source (local runners); xlang: Beam's Java KafkaIO")
    parser.add_argument("--kafka_expansion_service", default=None,
                        help="host:port of a running Java IO expansion service for --kafka_io=xlang (Flink: "
                             "the one in deploy/flink, which runs Java transforms as processes); default: "
                             "Beam starts its own from the downloaded jar (Dataflow)")
    defaults = Topics()
    for name in ("events", "status", "scores", "rankings", "dead_letter"):
        parser.add_argument(f"--{name}_topic", default=getattr(defaults, name),
                            help=f"Kafka topic: {name.replace('_', ' ')} (default {getattr(defaults, name)})")
    parser.add_argument("--owner_slots", type=int, default=RankingConfig.owner_slots,
                        help="owners with a task in this many recent slots are ranked")
    parser.add_argument("--range_m", type=float, default=RankingConfig.range_m,
                        help="candidate range in metres (0: every device with a status)")
    parser.add_argument("--top_k", type=int, default=RankingConfig.top_k,
                        help="candidates per ranking by VoC (plus the (T, VoC) frontier)")
    parser.add_argument("--scores_per_owner", type=int, default=RankingConfig.scores_per_owner,
                        help="trust-scores records per owner (its most trusted candidates)")
    parser.add_argument("--default_threshold", type=float, default=RankingConfig.default_threshold,
                        help="theta for owners whose tasks carry none")
    parser.add_argument("--recalibration_memory", type=float, default=RecalibrationConfig.memory,
                        help="the online recalibration's memory: the weight of a slot's residuals one slot later "
                             "(model.recalibration)")
    parser.add_argument("--recalibration_guard", type=float, default=RecalibrationConfig.guard,
                        help="standard errors the recent mean residual must clear before it moves T_beh")
    parser.add_argument("--recalibration", choices=("level", "off"), default="level",
                        help="level: publish T_beh moved by the online level shift of the recent outcomes "
                             "(model.recalibration); off: the model's T_beh as it is")
    parser.add_argument("--threshold_floor", type=float, default=None,
                        help="the lowest theta the schedulers ask: rankings are made at min(owner's theta, this) "
                             "and answer every theta above it (default: the owner's theta)")


def job_parser() -> argparse.ArgumentParser:
    """A plain parser of :func:`add_job_arguments`' flags alone."""
    parser = argparse.ArgumentParser(prog="trustbeam", add_help=False, allow_abbrev=False)
    add_job_arguments(parser)
    return parser


def job_flags() -> set[str]:
    """Every ``--flag`` of :func:`add_job_arguments`."""
    return {flag for action in job_parser()._actions for flag in action.option_strings}


def spelled(args: list[str], known: Iterable[str]) -> list[str]:
    """``args`` with each option spelled as it is declared (``--lateness-slots`` -> ``--lateness_slots``).

    Raises ValueError naming an option ``known`` lacks, with the closest known spellings: Beam itself would discard
    it with a warning, so a typo would silently run on a default.
    """
    known = set(known)
    out = []
    for arg in args:
        if not arg.startswith("--"):
            out.append(arg)
            continue
        name, sep, value = arg.partition("=")
        spelling = next((s for s in (name, name.replace("-", "_"), "--" + name[2:].replace("-", "_")) if s in known),
                        None)
        if spelling is None:
            close = difflib.get_close_matches(name.replace("-", "_"), sorted(known), n=3, cutoff=0.6)
            hint = f"; did you mean {' or '.join(close)}?" if close else ""
            raise ValueError(f"unrecognized option {name}{hint}")
        out.append(spelling + sep + value)
    return out


@dataclass(frozen=True)
class JobConfig:
    """Everything the transforms need, validated before the pipeline is built."""

    checkpoint: str
    backend: str = "torch"
    onnx_model: str | None = None
    parquet_out: str | None = None
    shards: int = 4
    pieces: Pieces = field(default_factory=lambda: Pieces(SCORE_PIECES))
    lateness_slots: int = 1
    tombstone_slots: int = 64
    ranking: RankingConfig = field(default_factory=RankingConfig)
    params: SystemParams = field(default_factory=SystemParams)
    topics: Topics = field(default_factory=Topics)
    max_future_s: float = MAX_FUTURE_S
    max_skew_s: float = MAX_SKEW_S
    model_sha256: str | None = None  # pinned when the config is built: workers refuse any other model at the URI
    group_id: str | None = None  # the streaming job's consumer group (default trustbeam-<events topic>)
    device: str = "auto"  # auto | cpu | cuda (model.stages.resolve_device)
    model_threads: int = 0  # CPU threads of the model per worker process; 0: the runtime's default (every core)
    replay_through: int | None = None  # a bounded re-run: the last slot an earlier run published (None: streaming)
    # the online level shift of the published T_beh (model.recalibration); None: the model's T_beh as it is
    recalibration: RecalibrationConfig | None = field(default_factory=RecalibrationConfig)

    def __post_init__(self) -> None:
        if not artifacts.exists(self.checkpoint, CHECKPOINT_MANIFEST):
            raise ValueError(f"--checkpoint: model not found: {self.checkpoint!r} holds no checkpoint (no config.json)")
        if self.model_sha256 is None:
            object.__setattr__(self, "model_sha256", artifacts.content_hash(self.checkpoint))
        if self.group_id is None:
            object.__setattr__(self, "group_id", f"trustbeam-{self.topics.events}")
        if self.device not in DEVICES:  # a missing GPU is the workers' to report (the launcher may have none)
            raise ValueError(f"--device: must be one of {', '.join(DEVICES)} (got {self.device!r})")
        if self.model_threads < 0:
            raise ValueError(f"--model_threads: must be >= 0 (got {self.model_threads!r})")
        if self.backend not in BACKENDS:
            raise ValueError(f"--backend: must be one of {', '.join(BACKENDS)} (got {self.backend!r})")
        if self.backend == "onnx" and not artifacts.exists(self.onnx_dir, ONNX_MANIFEST):
            raise ValueError(f"--onnx_model: {self.onnx_dir!r} holds no ONNX export (no manifest.json); "
                             f"run `trustbeam export-onnx --checkpoint {self.checkpoint}`")
        if not 1 <= self.shards <= 4096:
            raise ValueError(f"--shards: must lie in 1..4096 (got {self.shards!r})")
        if not self.max_future_s > 0:
            raise ValueError(f"--max_future_s: must be > 0 seconds (got {self.max_future_s!r})")
        if not 0 <= self.max_skew_s <= self.max_future_s:
            raise ValueError(f"--max_skew_s: must lie in [0, --max_future_s] seconds (got {self.max_skew_s!r})")
        if self.lateness_slots < 0:
            raise ValueError(f"--lateness_slots: must be >= 0 (got {self.lateness_slots!r})")
        if self.replay_through is not None and self.replay_through < -1:
            raise ValueError(f"--replay_through: must be a slot >= -1 (got {self.replay_through!r})")
        if self.tombstone_slots < 1:
            raise ValueError(f"--tombstone_slots: must be >= 1 (got {self.tombstone_slots!r})")

    @classmethod
    def from_args(cls, args: list[str]) -> "JobConfig":
        """From a command line's job options (:func:`add_job_arguments`); other flags, such as Beam's, are left to
        whoever declares them, as Beam's own parser leaves ours."""
        return cls.from_namespace(job_parser().parse_known_args(args)[0])

    @classmethod
    def from_namespace(cls, o: argparse.Namespace) -> "JobConfig":
        """From parsed job options: :meth:`from_args`'s, or Beam's view of them (``TrustbeamOptions``)."""
        if not o.checkpoint:
            raise ValueError("--checkpoint: required (a directory written by `trustbeam train`)")
        ranking = RankingConfig(owner_slots=o.owner_slots, range_m=o.range_m or None, top_k=o.top_k,
                                scores_per_owner=o.scores_per_owner, default_threshold=o.default_threshold,
                                threshold_floor=o.threshold_floor)
        topics = Topics(o.events_topic, o.status_topic, o.scores_topic, o.rankings_topic, o.dead_letter_topic)
        try:
            pieces = Pieces(o.score_pieces, o.cell_m)
        except ValueError as error:
            raise ValueError(f"--score_pieces/--cell_m: {error}") from None
        recalibration = None
        if o.recalibration == "level":
            try:
                recalibration = RecalibrationConfig(o.recalibration_memory, o.recalibration_guard)
            except ValueError as error:
                raise ValueError(f"--recalibration_memory/--recalibration_guard: {error}") from None
        return cls(o.checkpoint, o.backend, o.onnx_model, o.parquet_out, o.shards, pieces, o.lateness_slots,
                   o.tombstone_slots, ranking, topics=topics, max_future_s=o.max_future_s, max_skew_s=o.max_skew_s,
                   model_sha256=o.model_sha256, group_id=o.group_id, device=o.device,
                   model_threads=o.model_threads, replay_through=o.replay_through, recalibration=recalibration)

    @property
    def onnx_dir(self) -> str:
        return self.onnx_model or f"{self.checkpoint.rstrip('/')}/onnx"

    def stages(self) -> tuple[Stages, str]:
        """The model's stages on the chosen backend and the model version (loaded once per process, copied
        first when remote), running on ``model_threads`` CPU threads (PyTorch's are the process's: set here). The
        ONNX export must come from this checkpoint."""
        if self.backend == "torch" and self.model_threads:
            torch.set_num_threads(self.model_threads)
        return _load(_absolute(self.checkpoint), _absolute(self.onnx_dir) if self.backend == "onnx" else None,
                     self.model_sha256, self.device, self.model_threads)


def _absolute(uri: str) -> str:
    return uri if artifacts.is_remote(uri) else str(Path(uri.removeprefix("file://")).resolve())


@lru_cache(maxsize=4)
def _load(checkpoint: str, onnx_dir: str | None, content_hash: str, device: str, threads: int
          ) -> tuple[Stages, str]:
    model, index, manifest = load(artifacts.localize(checkpoint, CHECKPOINT_MANIFEST))
    if manifest["content_hash"] != content_hash:
        raise CheckpointError(f"--checkpoint: the model at {checkpoint!r} is {manifest['model_version']!r}, not the "
                              f"one this job runs (content hash {content_hash[:12]}...): a model URI must not change "
                              "under a job; publish a new model under a new URI")
    if onnx_dir is None:
        return TorchStages(model, index, device=resolve_device(device)), manifest["model_version"]
    from exporters.onnx import OnnxStages

    return (OnnxStages(artifacts.localize(onnx_dir, ONNX_MANIFEST), expect_content_hash=manifest["content_hash"],
                       device=device, threads=threads),
            manifest["model_version"])
