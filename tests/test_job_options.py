"""Pipeline options: validated before anything runs, with errors that name the option; the offline CLI."""

from __future__ import annotations

import io
import json
import logging

import pyarrow.parquet as pq
import pytest
from apache_beam.io.localfilesystem import LocalFileSystem
from apache_beam.options.pipeline_options import PipelineOptions

from beam_pipeline.options import JobConfig
from model.recalibration import RecalibrationConfig
from schemas import CollaboratorRanking, TrustScore, from_json
from tests.pipeline_fixtures import run_tables, write_checkpoint
from trustbeam.cli import main


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory):
    return write_checkpoint(tmp_path_factory.mktemp("ckpt") / "model")


@pytest.mark.parametrize("args, message", [
    ([], "--checkpoint: required"),
    (["--checkpoint", "/nonexistent"], "--checkpoint: model not found"),
    (["--shards", "0"], "--shards: must lie in 1..4096"),
    (["--lateness_slots", "-1"], "--lateness_slots: must be >= 0"),
    (["--top_k", "0"], "RankingConfig.top_k: must be >= 1"),
    (["--replay_through", "-2"], "--replay_through: must be a slot >= -1"),
    (["--recalibration_memory", "1"], r"--recalibration_memory/--recalibration_guard: .*memory: must be in \[0, 1\)"),
    (["--recalibration_guard", "-1"], "--recalibration_memory/--recalibration_guard: .*guard: must be >= 0"),
    (["--model_threads", "-1"], "--model_threads: must be >= 0"),
])
def test_bad_options_are_refused_by_name(checkpoint, args, message) -> None:
    if args[:1] != ["--checkpoint"] and args:
        args = ["--checkpoint", str(checkpoint), *args]
    with pytest.raises(ValueError, match=message):
        JobConfig.from_args(args)


def test_options_reach_the_config(checkpoint) -> None:
    config = JobConfig.from_args(["--checkpoint", str(checkpoint), "--shards", "7", "--range_m", "0", "--top_k", "3",
                                  "--replay_through", "12"])
    assert (config.shards, config.ranking.range_m, config.ranking.top_k, config.replay_through) == (7, None, 3, 12)
    assert JobConfig.from_args(["--checkpoint", str(checkpoint)]).replay_through is None


def test_recalibration_options_reach_the_config(checkpoint) -> None:
    def config(*args: str) -> JobConfig:
        return JobConfig.from_args(["--checkpoint", str(checkpoint), *args])

    assert config().recalibration == RecalibrationConfig()  # on by default
    assert config("--recalibration_memory", "0.5", "--recalibration_guard", "3").recalibration == \
        RecalibrationConfig(0.5, 3.0)
    assert config("--recalibration", "off").recalibration is None


def test_the_model_runs_on_the_threads_the_option_gives(checkpoint, tmp_path) -> None:
    import torch

    from exporters.onnx import export_onnx

    def config(*args: str) -> JobConfig:
        return JobConfig.from_args(["--checkpoint", str(checkpoint), *args])

    assert config().model_threads == 0  # the runtime's default: nothing set
    default = torch.get_num_threads()
    config().stages()
    assert torch.get_num_threads() == default
    config("--model_threads", "1").stages()
    assert torch.get_num_threads() == 1
    export_onnx(str(checkpoint), tmp_path / "onnx")
    stages, _ = config("--backend", "onnx", "--onnx_model", str(tmp_path / "onnx"), "--model_threads", "2").stages()
    assert {s.get_session_options().intra_op_num_threads for s in stages.sessions.values()} == {2}


@pytest.mark.parametrize("argv, hint", [
    (["run", "--until-end", "--lateness-slots", "3", "--shard", "9"], "did you mean --shards"),
    (["score", "--events", "x", "--out", "y", "--top-kk", "2"], "did you mean --top_k"),
    (["run", "--follow", "--max-cycle", "2"], "unrecognized"),
    (["train", "--events", "x", "--out", "y", "--epoch", "3"], "did you mean --epochs"),
])
def test_a_typo_in_any_option_exits_2_with_a_suggestion(argv, hint, capsys) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2 and hint in capsys.readouterr().err


def test_pipeline_options_take_either_spelling() -> None:
    from beam_pipeline.pipeline_options import checked_pipeline_args

    assert checked_pipeline_args(["--lateness-slots", "3", "--top_k=2", "--runner", "x"]) == [
        "--lateness_slots", "3", "--top_k=2", "--runner", "x"]


def test_beam_reads_the_job_options_as_the_plain_parser_does(checkpoint) -> None:
    from beam_pipeline.pipeline_options import TrustbeamOptions

    args = ["--checkpoint", str(checkpoint), "--shards", "7", "--top_k", "3", "--recalibration", "off",
            "--score_pieces", "4", "--runner", "DirectRunner"]
    assert JobConfig.from_namespace(PipelineOptions(args).view_as(TrustbeamOptions)) == JobConfig.from_args(args)


def test_scoring_offline_imports_neither_beam_nor_the_fitting(checkpoint, tmp_path) -> None:
    """`trustbeam score` takes the job's options alone: Beam's import (~2.5 s) is no part of its start, nor
    scipy.optimize's (~0.5 s), which only training uses. A Beam option there is refused by name, as a typo is."""
    import subprocess
    import sys

    events, status = run_tables()
    pq.write_table(events, tmp_path / "events.parquet")
    pq.write_table(status, tmp_path / "status.parquet")
    script = ("import sys; from trustbeam.cli import main; code = main(sys.argv[1:]); "
              "print('imported:', *sorted({'apache_beam', 'scipy.optimize'} & set(sys.modules)), file=sys.stderr); "
              "sys.exit(code)")
    argv = ["score", "--events", str(tmp_path / "events.parquet"), "--status", str(tmp_path / "status.parquet"),
            "--out", str(tmp_path / "out"), "--checkpoint", str(checkpoint)]
    scored = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=300)
    assert scored.returncode == 0, scored.stderr[-2000:]
    assert scored.stderr.rstrip().endswith("imported:") and json.loads(scored.stdout)["trust_scores"] > 0
    refused = subprocess.run([sys.executable, "-c", script, *argv, "--runner", "DirectRunner"], capture_output=True,
                             text=True, timeout=300)
    assert refused.returncode == 2 and "unrecognized option --runner" in refused.stderr


def test_trustbeam_score_writes_valid_wire_records(checkpoint, tmp_path, capsys) -> None:
    events, status = run_tables()
    pq.write_table(events, tmp_path / "events.parquet")
    pq.write_table(status, tmp_path / "status.parquet")
    code = main(["score", "--events", str(tmp_path / "events.parquet"), "--status", str(tmp_path / "status.parquet"),
                 "--out", str(tmp_path / "out"), "--checkpoint", str(checkpoint), "--top_k", "2"])
    assert code == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert set(summary["seconds_by_phase"]) == {"model", "read", "score"}  # and each phase said so as it ended
    assert set(summary["seconds_by_stage"]) == {"status", "slot_part", "frame", "pairs", "write"}
    assert all(f"trustbeam score: {name} " in captured.err for name in summary["seconds_by_phase"])
    scores = [from_json(TrustScore, line) for line in (tmp_path / "out" / "trust-scores.jsonl").read_bytes().splitlines()]
    rankings = [from_json(CollaboratorRanking, line)
                for line in (tmp_path / "out" / "collaborator-rankings.jsonl").read_bytes().splitlines()]
    assert summary["trust_scores"] == len(scores) > 0 and summary["rankings"] == len(rankings) > 0
    for r in rankings:  # 2 by VoC, then only the (T, VoC) frontier: each more trusted than all before it
        trust = [c.trust for c in r.candidates]
        assert all(t > max(trust[:i]) for i, t in enumerate(trust) if i >= 2)
    assert main(["score", "--events", "x", "--out", "y"]) == 2  # no checkpoint: a clear error, not a traceback
    assert "no --status" not in captured.err


def test_trustbeam_score_without_status_says_why_its_rankings_are_empty(checkpoint, tmp_path, capsys) -> None:
    events, _ = run_tables()
    pq.write_table(events, tmp_path / "events.parquet")
    assert main(["score", "--events", str(tmp_path / "events.parquet"), "--out", str(tmp_path / "out"),
                 "--checkpoint", str(checkpoint)]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary["trust_scores"] == 0 and summary["rankings"] > 0  # every owner's ranking, each empty
    assert "no --status: no device has a known status, so no owner has candidates" in captured.err


class TbTestFileSystem(LocalFileSystem):
    """A Beam filesystem with its own scheme over local files: stands in for gs:// or s3:// here."""

    @classmethod
    def scheme(cls) -> str:
        return "tbtest"

    @staticmethod
    def _strip(path: str) -> str:
        return path.removeprefix("tbtest://")

    def join(self, base: str, *paths: str) -> str:
        return "/".join([base.rstrip("/"), *paths])

    def exists(self, path: str) -> bool:
        return super().exists(self._strip(path))

    def open(self, path: str, *args, **kwargs):
        return super().open(self._strip(path), *args, **kwargs)


def test_a_model_on_a_beam_filesystem_is_copied_once_and_verified(checkpoint, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TRUSTBEAM_STATE_DIR", str(tmp_path))
    uri = f"tbtest://{checkpoint}"
    config = JobConfig(uri)
    stages, version = config.stages()
    local, local_version = JobConfig(str(checkpoint)).stages()
    assert version == local_version and stages.index == local.index
    copies = list((tmp_path / "artifacts").iterdir())
    assert len(copies) == 1 and sorted(p.name for p in copies[0].iterdir()) == ["config.json", "node2vec.npy",
                                                                                "weights.pt"]
    with pytest.raises(ValueError, match="--checkpoint: model not found"):
        JobConfig(f"tbtest://{tmp_path}/nothing")
    with pytest.raises(ValueError, match="no Beam filesystem handles this scheme"):
        JobConfig("nosuch://bucket/model")


def test_an_onnx_export_on_a_beam_filesystem_is_copied_with_the_graphs_its_manifest_lists(tmp_path, monkeypatch
                                                                                         ) -> None:
    """A model that reads no Y is exported as its head graphs alone: the copy holds those, and scores."""
    from exporters.onnx import export_onnx

    monkeypatch.setenv("TRUSTBEAM_STATE_DIR", str(tmp_path / "state"))
    checkpoint = write_checkpoint(tmp_path / "model", reads_y=False)
    export_onnx(checkpoint)
    config = JobConfig(f"tbtest://{checkpoint}", backend="onnx")
    stages, _ = config.stages()
    copies = {tuple(sorted(p.name for p in copy.iterdir())) for copy in (tmp_path / "state" / "artifacts").iterdir()}
    assert copies == {("config.json", "node2vec.npy", "weights.pt"), ("head.onnx", "manifest.json", "pairs.onnx")}
    assert not stages.uses_encoder


class _Payload:
    def __reduce__(self):
        return (print, ("this would have run on load",))


def test_a_checkpoint_with_pickled_code_is_refused_even_with_matching_hashes(checkpoint, tmp_path) -> None:
    """An attacker who can rewrite every file (and so every hash) still cannot run code at load."""
    import pickle
    import shutil

    from model.checkpoint import CheckpointError, _content_hash, file_sha256, load

    forged = tmp_path / "forged"
    shutil.copytree(checkpoint, forged)
    (forged / "weights.pt").write_bytes(pickle.dumps({"x": _Payload()}))
    manifest = json.loads((forged / "config.json").read_text())
    manifest["files"]["weights.pt"] = file_sha256(forged / "weights.pt")
    manifest["content_hash"] = _content_hash(manifest["config"], manifest["ids"], manifest["files"])
    (forged / "config.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="weights.pt: refused, not a plain tensor file"):
        load(forged)


@pytest.mark.parametrize("replace", [True, False])
def test_concurrent_writers_of_one_staged_directory_leave_one_complete_copy(tmp_path, replace: bool) -> None:
    import threading

    from model.checkpoint import staged_directory

    target, errors = tmp_path / "artifact", []
    start = threading.Barrier(8)

    def write(k: int) -> None:
        try:
            start.wait()
            with staged_directory(target, replace=replace) as staging:
                for name in ("a", "b"):
                    (staging / name).write_text(f"writer {k}")
        except Exception as error:  # noqa: BLE001 - collected for the assertion
            errors.append(error)

    threads = [threading.Thread(target=write, args=(k,)) for k in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifact"]  # no staging or set-aside copy left
    assert (target / "a").read_text() == (target / "b").read_text()  # one writer's complete copy


@pytest.mark.parametrize("level, shown", [(logging.ERROR, False), (logging.INFO, True)])
def test_kafka_pythons_close_race_is_one_warning_line_not_a_traceback(level, shown) -> None:
    from trustbeam.cli import CloseRaceFilter

    logger, stream = logging.getLogger("kafka.net.selector.test"), io.StringIO()
    handler = logging.StreamHandler(stream)
    logger.addFilter(close := CloseRaceFilter())
    logger.addHandler(handler)
    logger.setLevel(level)
    try:
        try:
            raise ValueError("generator already executing")
        except ValueError:
            logger.exception("Error closing coroutine for cancelled task")
            logger.exception("IO loop crashed")  # every other error keeps its traceback
    finally:
        logger.removeFilter(close)
        logger.removeHandler(handler)
    lines = stream.getvalue()
    assert ("Error closing coroutine for cancelled task: ValueError('generator already executing')" in lines) == shown
    assert lines.count("Traceback") == 1 and "IO loop crashed" in lines


def test_the_command_exits_with_mains_code() -> None:
    """`python -m trustbeam.cli` (and the `trustbeam` script, trustbeam.cli.program) exits as main returns."""
    import subprocess
    import sys

    failed = subprocess.run([sys.executable, "-m", "trustbeam.cli", "score", "--events", "x", "--out", "y"],
                            capture_output=True, text=True, timeout=120)
    assert failed.returncode == 2 and "--checkpoint: required" in failed.stderr
    helped = subprocess.run([sys.executable, "-m", "trustbeam.cli", "score", "--help"], capture_output=True, text=True,
                            timeout=120)
    assert helped.returncode == 0 and "--events" in helped.stdout
