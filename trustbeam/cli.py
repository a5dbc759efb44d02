"""The ``trustbeam`` command line. Each subcommand is a thin adapter over the library."""

from __future__ import annotations

import argparse
import difflib
import gc
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from kafka.errors import KafkaError

from model.config import DEVICES, SlotClock
from simulator.config import AttackKind, ChannelModel, Policy, SimConfig, attack_setting, parse_attack, parse_mix
from trustbeam.progress import Phases, bar

if TYPE_CHECKING:
    from model.bm import BMConfig

Handler = Callable[[argparse.Namespace], int]
# model.evaluate.METHODS, spelled out so that building the parser imports no model (a test keeps them equal)
EVALUATE_METHODS = ("bm", "bm_paper", "lstm", "transformer", "gnn", "gnn_pool", "channel_beta", "channel_beta_sized",
                    "fxg", "beta", "qs_trust", "mean", "oracle", "bayes")


def _add_device_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", choices=DEVICES, default="auto",
                        help="where the models train: auto = the GPU when PyTorch sees one, else the CPU (the CPU "
                             "path is bit-reproducible per seed; the GPU's equal within float tolerance)")


def _add_attack_option(parser: argparse.ArgumentParser) -> None:
    kinds = ", ".join(kind.value for kind in AttackKind)
    parser.add_argument("--attack", default=None, metavar="KIND=SHARE",
                        help=f"a share of the devices attack, one kind a run: {kinds} (e.g. sybil=0.2; hidden labels "
                             "in the devices table's attack column)")
    parser.add_argument("--owner-reports", type=float, default=None, metavar="SHARE",
                        help="share of tasks whose outcome the owner reports (the event's reporter) rather than a "
                             "neutral monitor; default 1 with ballot-stuffing or bad-mouthing, else 0 (the paper)")
    parser.add_argument("--task-size-spread", type=float, default=None, metavar="X",
                        help="task sizes log-uniform within X times the nominal 5 MB; default 4 with opportunistic, "
                             "else 1 (the paper: every task 5 MB)")
    parser.add_argument("--id-spread-m", type=float, default=0.0, metavar="M",
                        help="a Sybil's or whitewasher's further ids stand up to M metres from the device in x and y "
                             "(default 0: one position, what one device reports)")
    parser.add_argument("--whitewash-from", type=int, default=0, metavar="SLOT",
                        help="whitewashers leave their ids (fake recoverers drop their loads) from this slot on "
                             "(default 0: throughout; e.g. the first test slot: a wave that starts after the model "
                             "was trained)")
    parser.add_argument("--rejoin-after", type=int, default=1, metavar="SLOTS",
                        help="slots from a whitewasher's leaving an id to its next id's first (default 1: the next "
                             "slot; e.g. 12: it stays away longer than a poor record is passed on, 10 slots)")
    parser.add_argument("--overclaimer-cpu-hz", type=float, default=None, metavar="HZ",
                        help="the CPU an overclaimer runs on while it claims the fastest (default: the slowest, "
                             "2e9; e.g. 4e9: a 1.5x lie)")
    parser.add_argument("--fake-load", type=float, default=None, metavar="LOAD",
                        help="the load a fake recoverer's statuses add at their busiest, dropped whenever its record "
                             "is poor (default: what a recovering device sheds, 0.25; 0: the control, the same "
                             "devices telling the truth)")
    parser.add_argument("--fake-burn", action="store_true",
                        help="fake recoverers run their excess load (a busy loop) instead of reporting it: truthful "
                             "statuses, tasks slowed by the load, what a check of the tasks' times cannot see")
    parser.add_argument("--churn", type=float, default=0.0, metavar="SHARE",
                        help="share of the honest devices that join after the start, each at a random slot before "
                             "the run's last tenth: the honest newcomers a whitewasher's fresh id hides among (default "
                             "0: every device there from the start, the paper)")
    parser.add_argument("--leave", type=float, default=0.0, metavar="SHARE",
                        help="share of the honest devices that leave before the end, each at a random slot after the "
                             "run's first tenth: the silent ids an honest newcomer may stand near (default 0: every "
                             "device there to the end, the paper)")


def _add_fall_earned_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--fall-earned", type=float, default=0.0, metavar="TASKS",
                        help="read a fall in a device's reported load only once it has served TASKS on-time tasks "
                             "since (default 0: at once; 2 cuts what devices that burn a load to drop it win, at a "
                             "cost to honest recovering devices; with loads reported)")


def _add_memories_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--memories", type=float, nargs="+", default=None, metavar="LAMBDA",
                        help="the forgetting factors per slot the head's evidence is kept at (default 0.7 0.9 0.95 "
                             "0.98; 0.995 is added where devices report loads): an ablation, --memories 0.7 leaves a "
                             "device's record beyond a few slots to the sequence encoder")


def _evidence_options(config: BMConfig, args: argparse.Namespace) -> BMConfig:
    """``config`` with the evidence options of train and evaluate (--fall-earned, --memories) applied."""
    from dataclasses import replace

    evidence = replace(config.evidence, fall_earned=args.fall_earned)
    return replace(config, evidence=evidence if args.memories is None else evidence.with_memories(args.memories))


def _positive_metres(option: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise ValueError(f"{option}: expected metres > 0 or 'none' (got {text!r})")
    return value


def _attack_setting(args: argparse.Namespace) -> dict:
    from dataclasses import replace

    if args.overclaimer_cpu_hz is not None and not args.attack:
        raise ValueError("--overclaimer-cpu-hz: only with --attack overclaiming=SHARE (got no --attack)")
    if args.fake_load is not None and not args.attack:
        raise ValueError("--fake-load: only with --attack fake-recovery=SHARE (got no --attack)")
    if args.fake_burn and not args.attack:
        raise ValueError("--fake-burn: only with --attack fake-recovery=SHARE (got no --attack)")
    if args.rejoin_after != 1 and not args.attack:
        raise ValueError("--rejoin-after: only with --attack whitewashing=SHARE (got no --attack)")
    attack = replace(parse_attack(args.attack), id_spread_m=args.id_spread_m, whitewash_from=args.whitewash_from,
                     rejoin_after=args.rejoin_after, overclaimer_cpu_hz=args.overclaimer_cpu_hz,
                     fake_load=args.fake_load, fake_burn=args.fake_burn) if args.attack else None
    return {**attack_setting(attack, args.owner_reports, args.task_size_spread), "churn": args.churn,
            "leave": args.leave}


def _add_sim_options(parser: argparse.ArgumentParser) -> None:
    defaults = SimConfig()
    parser.add_argument("--devices", type=int, default=defaults.devices, help="number of devices (N)")
    parser.add_argument("--tasks", type=int, default=defaults.tasks, help="tasks executed sequentially (M)")
    parser.add_argument("--slots", type=int, default=defaults.slots, help="time slots the tasks span (S)")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--area", type=float, default=defaults.area_m, help="side of the square area, m")
    parser.add_argument("--range", type=float, default=defaults.range_m, dest="range_m",
                        help="communication range for the random-in-range policy, m")
    parser.add_argument("--policy", choices=[p.value for p in Policy], default=defaults.policy.value)
    parser.add_argument("--channel", choices=[c.value for c in ChannelModel], default=defaults.channel.value,
                        help="transmission success model; ns3 needs the ns3 extra")
    parser.add_argument("--mix", default=None,
                        help="behaviour shares, e.g. stable_reliable=0.5,intermittent=0.5")
    _add_attack_option(parser)
    parser.add_argument("--status-every", type=int, default=defaults.status_every,
                        help="emit device status every this many slots")
    parser.add_argument("--telemetry", action="store_true",
                        help="statuses carry the devices' CPU load, and hidden behaviours leave the trace they would "
                             "(periodic devices fail when busy; changing devices' load drifts); off: the paper's "
                             "setting")


def sim_config(args: argparse.Namespace) -> SimConfig:
    extra = {"mix": parse_mix(args.mix)} if args.mix else {}
    return SimConfig(**_attack_setting(args), devices=args.devices, tasks=args.tasks, slots=args.slots, seed=args.seed,
                     area_m=args.area, range_m=args.range_m, policy=Policy(args.policy),
                     channel=ChannelModel(args.channel), status_every=args.status_every, telemetry=args.telemetry,
                     **extra)


def cmd_simulate(args: argparse.Namespace) -> int:
    from simulator.engine import Simulator
    from simulator.parquet_sink import ParquetSink

    config = sim_config(args)
    sinks: list = []
    out = args.out or (None if args.publish else "out/sim")
    if out:
        sinks.append(ParquetSink(out))
    publisher = None
    if args.publish:
        from simulator.publish import KafkaPublisher
        from exporters.kafka_client import KafkaSettings, Topics, ensure_topics, wait_until_answering

        settings = KafkaSettings.resolve(args.bootstrap)
        wait_until_answering(settings, timeout_s=5.0)
        ensure_topics(settings, Topics().partitions())
        publisher = KafkaPublisher(settings, rate=args.rate)
        sinks.append(publisher)
    started = time.perf_counter()
    summary = Simulator(config).run(sinks, progress=args.progress or sys.stderr.isatty())
    report = {**summary.as_dict(), "seconds": round(time.perf_counter() - started, 3)}
    if out:
        report["out"] = str(Path(out).resolve())
    if publisher:
        report.update(publisher.counts())
    print(json.dumps(report, indent=2))
    return 0


def cmd_broker(args: argparse.Namespace) -> int:
    from deploy.local.broker import LocalBroker
    from exporters.kafka_client import Topics, ensure_topics

    broker = LocalBroker(port=args.port)
    if args.action == "start":
        status = broker.start()
        created = ensure_topics(broker.settings, Topics().partitions())
        print(status, f"; topics created: {', '.join(created) or 'none (all existed)'}")
    elif args.action == "stop":
        if broker.stop():
            print("stopped", broker.bootstrap)
        else:
            from deploy.local.broker import listener

            other = listener(args.port)
            print(f"not running under {broker.state_dir}", broker.bootstrap + (f"; {other.advice(args.port)}"
                                                                              if other else ""))
            return 0 if other is None else 3
    else:
        status = broker.status()
        print(status)
        return 0 if status.answering else 3
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """The main job on embedded defaults (see trustbeam.demo)."""
    from trustbeam.demo import run_demo

    return run_demo(sim_config(args), args.bootstrap, args.out, args.epochs)


def cmd_train(args: argparse.Namespace) -> int:
    """Train BM (or a learned baseline) on an events file and write a checkpoint."""
    from dataclasses import asdict, replace

    import pyarrow.parquet as pq

    from model.bm import BMConfig
    from model.checkpoint import model_version, save
    from model.history import History
    from model.train import PAPER_GRID, TrainConfig, train_bm

    if args.head_epochs is not None and args.head_epochs < 1:
        raise ValueError(f"--head-epochs: expected at least 1 (got {args.head_epochs})")
    phase = Phases("train")
    with phase("read"):
        events = pq.read_table(args.events)
        status = pq.read_table(args.status) if args.status else None
    clock = SlotClock.from_metadata(events.schema.metadata) or SlotClock()
    if args.slot_seconds is not None or args.origin_ms is not None:
        clock = SlotClock(origin_ms=clock.origin_ms if args.origin_ms is None else args.origin_ms,
                          slot_ms=clock.slot_ms if args.slot_seconds is None else int(args.slot_seconds * 1000))
    config = replace(BMConfig(), clock=clock, window=args.window, sequence=args.sequence, head=args.head)
    config = _evidence_options(config, args)
    with phase("history"):
        history = History.from_events(events, config.clock, config.weights, status=status)
    train = TrainConfig(lr=args.lr, weight_decay=args.weight_decay, dropout=args.dropout, epochs=args.epochs,
                        patience=args.patience, seed=args.seed, grid=PAPER_GRID if args.grid == "paper" else {},
                        workers=args.workers, device=args.device)
    if args.head_epochs is not None:
        train = replace(train, head_epochs=args.head_epochs)
    with phase("train"):
        model, _, report = train_bm(history, config, train, progress=args.progress or sys.stderr.isatty())
    summary = {"setting": report.setting, "best_epoch": report.fit.best_epoch,
               "warm_up_val_loss": report.fit.start_loss, "val_loss": report.fit.val_losses,
               "train_loss": report.fit.train_losses, "test_rmse": report.test_rmse, "test_mae": report.test_mae,
               "train_slots": len(report.train_slots), "test_slots": len(report.test_slots),
               "devices": len(history.index), "search": report.search, "train_seconds": round(phase.seconds["train"], 1),
               "size_corrected": bool(config.head == "context" and model.head.sizing.adopted)}
    with phase("save"):
        content = save(model, history.index, args.out, metadata={"events": str(Path(args.events).resolve()),
                                                                 "status": args.status, "train": asdict(train),
                                                                 **summary})
    print(json.dumps({"checkpoint": str(Path(args.out).resolve()), "model_version": model_version(content),
                      **summary, "seconds_by_phase": {k: round(v, 2) for k, v in phase.seconds.items()}}, indent=2))
    return 0


def cmd_import_log(args: argparse.Namespace) -> int:
    """Turn an interaction log into events.parquet (graded outcomes), counting what was left out."""
    import pyarrow.parquet as pq

    from model.logs import LogMapping, import_log

    mapping = LogMapping(owner=args.owner_col, collaborator=args.collaborator_col, time=args.time_col,
                         outcome=args.outcome_col, outcome_range=tuple(args.outcome_range),
                         time_unit=args.time_unit, header=not args.no_header)
    events, dropped = import_log(args.csv, mapping, args.slot_days)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    partial = out / ".events.parquet.partial"
    pq.write_table(events, partial, compression="zstd")
    partial.replace(out / "events.parquet")
    slots = events["slot"].to_numpy()
    print(json.dumps({"events": events.num_rows, "left_out": dropped, "slots": int(slots.max() + 1) if len(slots) else 0,
                      "devices": len(set(events["owner"].to_pylist()) | set(events["collaborator"].to_pylist())),
                      "out": str((out / "events.parquet").resolve())}, indent=2))
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    """Every method on the same time split: RMSE/MAE vs next-slot T_col (and the hidden truth when simulated)."""
    from dataclasses import asdict, replace

    import pyarrow.parquet as pq

    from model.bimamba import MambaConfig
    from model.bm import BMConfig
    from model.evaluate import evaluate_log, write_predictions, write_report
    from simulator.experiment import evaluate_injected, evaluate_simulated
    from simulator.inject import injectable
    from model.gnn import GNNConfig
    from model.node2vec import Node2VecConfig
    from model.train import TrainConfig

    if args.quick:
        config = BMConfig(gnn=GNNConfig(node_dim=16, psi_dim=8, time_dim=8), node2vec=Node2VecConfig(dim=16,
                          walks_per_node=4, epochs=1), mamba=MambaConfig(d_model=32, d_state=8, n_layers=2), window=8,
                          head_members=2)
        train = TrainConfig(epochs=args.epochs or 4, patience=args.patience or 2, lr=3e-3, head_epochs=80,
                            head_patience=10)
        sim = SimConfig(devices=60, tasks=3000, slots=30)
    else:
        config, train, sim = BMConfig(), TrainConfig(epochs=args.epochs or 40, patience=args.patience or 5), SimConfig()
    if args.seed < 0:
        raise ValueError(f"--seed: must be >= 0 (got {args.seed})")
    train = replace(train, device=args.device, seed=args.seed)
    for option, name in (("--colocation-m", "colocation_m"), ("--succession-m", "succession_m"),
                         ("--poor-succession-m", "poor_succession_m")):
        text = getattr(args, name)
        if text != "default":
            radius = None if text == "none" else _positive_metres(option, text)
            config = replace(config, evidence=replace(config.evidence, **{name: radius}))
    config = _evidence_options(config, args)
    sim = replace(sim, seed=args.seed, telemetry=args.telemetry, **({"mix": parse_mix(args.mix)} if args.mix else {}),
                  **_attack_setting(args))
    if args.events and sim.attack is not None:
        injectable(sim.attack)
    if args.events and (args.owner_reports is not None or args.task_size_spread is not None):
        raise ValueError("--owner-reports, --task-size-spread: simulated runs only (a recorded --events log says who "
                         "reported and how large its tasks were)")
    if args.events and (args.sim_slots is not None or args.sim_devices is not None):
        raise ValueError("--sim-slots, --sim-devices: simulated runs only (a recorded --events log has its own "
                         "slots and devices)")
    if args.test_fraction is not None:
        train = replace(train, test_fraction=args.test_fraction)
    if args.sim_slots is not None:
        sim = sim.at_run_length(args.sim_slots)
    if args.sim_devices is not None:
        sim = sim.at_fleet_size(args.sim_devices)
    runs = args.runs or (2 if args.quick else 10)
    methods = args.methods or list(EVALUATE_METHODS)
    started = time.perf_counter()
    say = ((lambda m: print(f"trustbeam evaluate: {m}, {time.perf_counter() - started:.0f} s elapsed", file=sys.stderr,
                            flush=True)) if not args.quiet else (lambda _: None))

    def setup(done: int) -> dict:
        return {"runs": runs, "runs_done": done, "seed": args.seed, "mix": args.mix, "telemetry": args.telemetry,
                "attack": args.attack, "id_spread_m": args.id_spread_m, "owner_reports": sim.owner_reports,
                "task_size_spread": sim.task_size_spread, "whitewash_from": args.whitewash_from,
                "rejoin_after": args.rejoin_after, "churn": sim.churn,
                "leave": sim.leave,
                "overclaimer_cpu_hz": args.overclaimer_cpu_hz, "fake_load": args.fake_load,
                "fake_burn": args.fake_burn,
                "quick": args.quick, "bm": asdict(config), "train": asdict(train),
                "simulation": None if args.events else {"devices": sim.devices, "tasks": sim.tasks, "slots": sim.slots,
                                                        "area_m": sim.area_m},
                "seconds": round(time.perf_counter() - started, 1)}

    def keep(results: list) -> None:  # the report (and the forecasts) so far, rewritten after every run
        write_report(Path(args.out), title, [r.scores for r in results], setup(len(results)), notes)
        if args.predictions:
            write_predictions(Path(args.predictions), results, first_seed=args.seed)

    if args.protocol == "snapshots":
        return snapshot_report(args, config, train, say)
    if args.events:
        events = pq.read_table(args.events)
        clock = SlotClock.from_metadata(events.schema.metadata) or SlotClock()
        config = replace(config, clock=clock)
        status = pq.read_table(args.status) if args.status else None
        title, notes = f"trustbeam evaluation on {Path(args.events).name}", ["no hidden truth: scores are against "
                                                                           "the observed next-slot T_col only"]
        if args.attack:
            title += f" with {args.attack} injected"
            notes.append("every rating reported by its rater; the figures above are on the attacked log "
                         "(simulator.inject), the injected-attack table sets them against the clean twin")
            results = evaluate_injected(events, sim.attack, config, train, runs, methods, say, each_run=keep)
        else:
            results = evaluate_log(events, config, train, runs, methods, say, status, each_run=keep)
    else:
        title, notes = "trustbeam evaluation on the simulated paper setting", [
            "rmse/mae: against the observed next-slot T_col; *_truth: against the simulator's hidden expected "
            "reliability; oracle predicts the truth, so its rmse is the noise floor"]
        results = evaluate_simulated(sim, config, train, runs, methods, say, voc=not args.no_voc, each_run=keep)
    keep(results)
    report = json.loads((Path(args.out) / "report.json").read_text())
    print(json.dumps({m: {k: report[m][k]["mean"] for k in ("rmse", "mae", "rmse_truth") if k in report[m]}
                      for m in results[0].scores if "rmse" in report[m]}, indent=2))
    return 0


def snapshot_report(args: argparse.Namespace, config, train, say: Callable[[str], None]) -> int:
    """TrustGuard's single-timeslot protocol on a graded log (model.snapshots): report.json and report.md."""
    import pyarrow.parquet as pq

    from model.snapshots import evaluate_snapshots

    if not args.events:
        raise ValueError("--protocol snapshots: needs --events (a graded log, e.g. from import-log)")
    started = time.perf_counter()
    result = evaluate_snapshots(pq.read_table(args.events), config, train, args.snapshots, progress=say)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"title": f"single-timeslot prediction (TrustGuard's protocol) on {Path(args.events).name}",
              "setup": {"snapshots": args.snapshots, "train": {"epochs": train.epochs, "seed": train.seed},
                        "seconds": round(time.perf_counter() - started, 1)}, **result}
    (out / "report.json").write_text(json.dumps(report, indent=2))
    rows = [f"| {m} | {r['auc']:.3f} | {r['mcc']:.3f} | " + " | ".join(f"{x['auc']:.3f} / {x['mcc']:.3f}"
                                                                      for x in r["rounds"]) + " |"
            for m, r in result.items()]
    rounds = [f"k+1={x['k']}" for x in next(iter(result.values()))["rounds"]]
    lines = [f"# {report['title']}", "", "Distrust (a negative rating) of each rating in snapshot k+1 between devices "
             "seen in 1..k; AUC and MCC per round (bm's and distrust_share's threshold chosen on snapshot k; distrust_logit "
             "flags as many ratings as its probabilities expect; bm_blend's weight on BM against distrust_logit and its "
             "threshold on the previous round's test snapshot, distrust_logit alone in the first round), and their "
             "means:", "",
             "| method | AUC | MCC | " + " | ".join(rounds) + " |", "|---" * (3 + len(rounds)) + "|", *rows]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    print(json.dumps({m: {"auc": r["auc"], "mcc": r["mcc"]} for m, r in result.items()}, indent=2))
    return 0


def _job_config(beam_args: list[str]):
    """JobConfig from the job's options (--checkpoint, --shards, ...; see beam_pipeline.options); Beam not imported."""
    from beam_pipeline.options import JobConfig

    return JobConfig.from_args(beam_args)


def cmd_score(args: argparse.Namespace, beam_args: list[str]) -> int:
    """Offline scoring of an events file: the same slot scorer the pipeline runs, to JSON-lines files."""
    import numpy as np
    import pyarrow.parquet as pq

    from exporters.parquet import ParquetResults
    from model.json_records import render_records
    from model.recalibration import OnlineShift
    from model.scoring import score_log
    from model.timing import timed

    config = _job_config(beam_args)
    phase = Phases("score")
    with phase("model"):
        stages, version = config.stages()
    with phase("read"):
        events = pq.read_table(args.events)
        status = pq.read_table(args.status) if args.status else None
    if status is None:  # said, not found out from empty files: candidates are devices with a known status
        print("trustbeam score: no --status: no device has a known status, so no owner has candidates; the "
              "rankings will be empty and no trust score published (pass --status STATUS, e.g. simulate's "
              "status.parquet)", file=sys.stderr)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    counts = {"slots": 0, "trust_scores": 0, "rankings": 0}
    parquet = ParquetResults(config.parquet_out) if config.parquet_out else None
    slots = len(np.unique(stages.config.clock.slot_of(events["event_time_ms"].to_numpy())))
    with open(out / "trust-scores.jsonl", "wb") as scores, open(out / "collaborator-rankings.jsonl", "wb") as ranks, \
            phase("score"):
        seconds: dict[str, float] = {}
        for result in bar(score_log(stages, events, status, config.ranking, config.params, version, seconds,
                                    OnlineShift.start(config.recalibration), config.pieces), slots,
                          "slot", args.progress or None):
            with timed(seconds, "write"):  # the records' JSON Lines (and Parquet), after score_log's stages
                scores.write(result.scores.json_lines(render_records))
                ranks.write(result.rankings.json_lines(render_records))
                if parquet is not None:
                    parquet.write(result)
            counts["slots"] += 1
            counts["trust_scores"] += len(result.scores)
            counts["rankings"] += len(result.rankings)
    print(json.dumps({**counts, "model_version": version, "out": str(out.resolve()), "parquet_out": config.parquet_out,
                      "seconds_by_phase": {k: round(v, 2) for k, v in phase.seconds.items()},
                      "seconds_by_stage": {k: round(v, 2) for k, v in seconds.items()}}, indent=2))
    return 0


def cmd_run(args: argparse.Namespace, beam_args: list[str]) -> int:
    """The streaming job over Kafka on a local runner (see beam_pipeline.run for the cycle semantics)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_pipeline.pipeline import streaming_pipeline
    from beam_pipeline.pipeline_options import TrustbeamOptions
    from beam_pipeline.run import run
    from exporters.kafka_client import KafkaSettings, check_topics, wait_until_answering

    config = _job_config(beam_args)
    settings = KafkaSettings.resolve(args.bootstrap)
    wait_until_answering(settings)
    check_topics(settings, config.topics)
    options = PipelineOptions(beam_args, runner=args.runner, streaming=True)
    if options.view_as(TrustbeamOptions).kafka_io == "xlang":  # Flink/Dataflow: Beam's Java KafkaIO, unbounded
        streaming_pipeline(options, settings, config).run().wait_until_finish()
        return 0
    stop = graceful_stop()
    for cycle, report in enumerate(run(settings, config, args.group, follow=args.follow, poll_s=args.poll_seconds,
                                       max_cycles=args.max_cycles, runner=args.runner, beam_args=beam_args,
                                       retry_deadline_s=args.retry_deadline_seconds, stop=stop), start=1):
        print(report.line(cycle), file=sys.stderr, flush=True)  # for the operator; stdout stays one JSON per cycle
        print(json.dumps({"published_slots": report.published_slots, "slots": len(report.published_slots),
                          "records_published": report.records_published, "progress_ms": report.progress_ms,
                          "retries": report.retries, "log_replaced": report.log_replaced, "lag": report.lag,
                          "state_bytes": report.state_bytes, "seconds": report.seconds,
                          "counters": report.counters}), flush=True)
    return 0


def graceful_stop() -> threading.Event:
    """SIGINT or SIGTERM ends ``run`` after the cycle in flight, its ledger saved (a cycle is never cut in half:
    an interrupt inside Beam's runner could leave its threads holding the process); a second signal ends
    the process at once, as a kill would (the ledger then replays the cycle)."""
    stop = threading.Event()

    def handle(number: int, _frame: object) -> None:
        if stop.is_set():
            os._exit(128 + number)
        stop.set()
        print(f"trustbeam run: {signal.Signals(number).name}: stopping after the cycle in flight (again to stop now)",
              file=sys.stderr, flush=True)

    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, handle)
    return stop


def cmd_export_onnx(args: argparse.Namespace) -> int:
    """The checkpoint's three stages to ONNX, checked by onnx.checker and against PyTorch before they are kept."""
    from exporters.onnx import export_onnx

    started = time.perf_counter()
    manifest = export_onnx(args.checkpoint, args.out)
    print(json.dumps({k: manifest[k] for k in ("model_version", "window", "d_model", "devices", "opset", "files")}
                     | {"out": str(Path(args.out or Path(args.checkpoint) / "onnx").resolve()),
                        "seconds": round(time.perf_counter() - started, 1)}, indent=2))
    return 0


def cmd_schedule_demo(args: argparse.Namespace) -> int:
    """A scheduler on the live topics in a closed loop, against random and oracle selection."""
    from trustbeam.schedule import run_schedule_demo

    return run_schedule_demo(sim_config(args), args.bootstrap, args.epochs, args.warmup, args.loop)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trustbeam", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    simulate = sub.add_parser("simulate", help="simulate the paper's setting to Parquet and/or Kafka")
    _add_sim_options(simulate)
    simulate.add_argument("--out", default=None, help="directory for the Parquet files (default out/sim)")
    simulate.add_argument("--publish", action="store_true", help="produce events and status to Kafka")
    simulate.add_argument("--bootstrap", default=None, help="Kafka brokers (else KAFKA_BOOTSTRAP, else local)")
    simulate.add_argument("--rate", type=float, default=None, help="events per second when publishing")
    simulate.add_argument("--progress", action="store_true", help="show a progress bar even without a tty")
    simulate.set_defaults(handler=cmd_simulate)

    broker = sub.add_parser("broker", help="the local Kafka-protocol broker (Tansu)")
    broker.add_argument("action", choices=["start", "stop", "status"])
    broker.add_argument("--port", type=int, default=19092)
    broker.set_defaults(handler=cmd_broker)

    train = sub.add_parser("train", help="train BM on an events file (time split, early stopping) to a checkpoint")
    train.add_argument("--events", required=True, help="events.parquet (simulate or import-log output)")
    train.add_argument("--status", default=None, help="status.parquet (positions and CPUs: the pairs' physics); "
                                                      "without it BM knows no distances")
    train.add_argument("--out", required=True, help="checkpoint directory")
    train.add_argument("--slot-seconds", type=float, default=None,
                       help="slot length, s (default: the clock recorded in the events file, else 60)")
    train.add_argument("--origin-ms", type=int, default=None, help="slot origin, ms since epoch (default: the file's)")
    train.add_argument("--window", type=int, default=32, help="slots of history per device (S)")
    train.add_argument("--sequence", choices=["bimamba", "lstm", "transformer", "last", "pool"], default="bimamba")
    train.add_argument("--head", choices=["context", "paper"], default="context",
                       help="context: T_beh from Y, the pair's physics and evidence; paper: MLP(Y_i, Y_j) alone")
    train.add_argument("--lr", type=float, default=1e-3)
    train.add_argument("--weight-decay", type=float, default=1e-5)
    train.add_argument("--dropout", type=float, default=0.0)
    train.add_argument("--epochs", type=int, default=40)
    train.add_argument("--patience", type=int, default=5)
    train.add_argument("--head-epochs", type=int, default=None,
                       help="most epochs of the context head's warm-up on its own inputs, before the end-to-end "
                            "epochs (default: TrainConfig.head_epochs; it stops early on the validation loss)")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--grid", choices=["none", "paper"], default="none",
                       help="paper: blocked 5-fold CV over the paper's lr x L2 x dropout grid")
    train.add_argument("--workers", type=int, default=1, help="processes scoring grid settings in parallel")
    _add_fall_earned_option(train)
    _add_memories_option(train)
    _add_device_option(train)
    train.add_argument("--progress", action="store_true")
    train.set_defaults(handler=cmd_train)

    log = sub.add_parser("import-log", help="turn an interaction log (CSV/Parquet) into events.parquet")
    log.add_argument("--csv", required=True, help="the log (.csv, or .parquet)")
    log.add_argument("--owner-col", required=True, help="rater column (name, or 0-based position with --no-header)")
    log.add_argument("--collaborator-col", required=True, help="rated device column")
    log.add_argument("--time-col", required=True)
    log.add_argument("--outcome-col", required=True)
    log.add_argument("--outcome-range", type=float, nargs=2, required=True, metavar=("LO", "HI"))
    log.add_argument("--time-unit", choices=["s", "ms"], default="s")
    log.add_argument("--no-header", action="store_true")
    log.add_argument("--slot-days", type=float, default=14.0)
    log.add_argument("--out", required=True)
    log.set_defaults(handler=cmd_import_log)

    evaluate = sub.add_parser("evaluate", help="compare BM with the baselines (RMSE/MAE) on a simulated or real log")
    evaluate.add_argument("--events", default=None, help="an events.parquet (default: simulate the paper setting)")
    evaluate.add_argument("--status", default=None, help="the log's status.parquet (positions and CPUs for the "
                                                         "pairs' physics); without it the physics is unknown")
    evaluate.add_argument("--out", required=True, help="directory for report.json and report.md")
    evaluate.add_argument("--quick", action="store_true", help="small sizes, for the test suite")
    evaluate.add_argument("--runs", type=int, default=None, help="seeds (default 10, quick 2)")
    evaluate.add_argument("--epochs", type=int, default=None, help="most epochs per fit (default 40, quick 4)")
    evaluate.add_argument("--patience", type=int, default=None, help="early-stopping patience (default 5, quick 2)")
    evaluate.add_argument("--test-fraction", type=float, default=None,
                          help="share of slots tested (default 0.2; 0.8 trains on the first 20%% for a long horizon)")
    evaluate.add_argument("--sim-slots", type=int, default=None,
                          help="simulated slots (default 100), tasks scaled to keep the tasks per slot")
    evaluate.add_argument("--sim-devices", type=int, default=None,
                          help="simulated devices (default 500), tasks and the area scaled to keep the tasks per "
                               "device and the devices per km2")
    evaluate.add_argument("--no-voc", action="store_true", help="skip the selection (VoC) experiment")
    evaluate.add_argument("--seed", type=int, default=0,
                          help="the first run's seed (simulation and training); run k uses seed + k")
    evaluate.add_argument("--mix", default=None, help="simulated behaviour shares, e.g. stable_reliable=0.5,"
                                                      "periodic=0.5 (default: the paper setting's mix)")
    evaluate.add_argument("--telemetry", action="store_true",
                          help="simulate the setting with telemetry (statuses carry the CPU load; periodic devices "
                               "fail when busy; changing devices' load drifts) instead of the paper's")
    _add_attack_option(evaluate)
    _add_fall_earned_option(evaluate)
    _add_memories_option(evaluate)
    evaluate.add_argument("--colocation-m", default="default", metavar="M|none",
                          help="ids whose reported positions lie within M metres of each other are judged as one "
                               "collaborator (default: EvidenceConfig's 0.1 m; none: every id apart)")
    evaluate.add_argument("--succession-m", default="default", metavar="M|none",
                          help="an id first heard of within M metres of where another fell silent (at most 10 slots "
                               "before) continues its record (default: EvidenceConfig's 5 m; none: never)")
    evaluate.add_argument("--poor-succession-m", default="default", metavar="M|none",
                          help="an id first heard of within M metres of where an id with a record poorer than "
                               "the fleet's fell silent (1-10 slots after) continues that record, one to one by the "
                               "least costly matching (default: EvidenceConfig's 150 m; none: never)")
    evaluate.add_argument("--protocol", choices=["slots", "snapshots"], default="slots",
                          help="slots: next-slot T_col on the last --test-fraction of slots; snapshots: TrustGuard's "
                               "single-timeslot distrust prediction (AUC, MCC) over --snapshots equal-time snapshots "
                               "of a graded --events log, by BM, the trustee's share of distrust, a learned rule over "
                               "raters' and trustees' figures, and BM blended with it")
    evaluate.add_argument("--snapshots", type=int, default=10, help="snapshots of the snapshot protocol")
    evaluate.add_argument("--predictions", default=None, metavar="FILE",
                          help="also write every test edge's slot, owner, collaborator, target and each method's "
                               "forecast (one row per run and edge) to this Parquet file")
    evaluate.add_argument("--methods", nargs="+", default=None, choices=EVALUATE_METHODS,
                          help="default: every method")
    _add_device_option(evaluate)
    evaluate.add_argument("--quiet", action="store_true")
    evaluate.set_defaults(handler=cmd_evaluate)

    score = sub.add_parser("score", help="score an events file offline with a checkpoint (the pipeline's scorer)",
                           epilog="Model and ranking options as for run: --checkpoint DIR, --range_m, --top_k, ...")
    score.add_argument("--events", required=True)
    score.add_argument("--status", default=None, help="status.parquet (T_res and positions)")
    score.add_argument("--out", required=True, help="directory for trust-scores.jsonl and collaborator-rankings.jsonl")
    score.add_argument("--progress", action="store_true", help="show a progress bar even without a tty")
    score.set_defaults(handler=cmd_score, options="job")

    export = sub.add_parser("export-onnx", help="export a checkpoint's GNN, BiMamba and pair head to ONNX")
    export.add_argument("--checkpoint", required=True)
    export.add_argument("--out", default=None, help="directory (default CHECKPOINT/onnx)")
    export.set_defaults(handler=cmd_export_onnx)

    job = sub.add_parser("run", help="the streaming job: Kafka in, trust scores and rankings out",
                         epilog="Pipeline options (--checkpoint DIR, --shards, --lateness_slots, --top_k, --range_m, "
                                "...) and Beam's own pass through to Beam (beam_pipeline.pipeline_options).")
    mode = job.add_mutually_exclusive_group(required=True)
    mode.add_argument("--until-end", action="store_true", help="process the topics to their current end, then exit")
    mode.add_argument("--follow", action="store_true", help="keep publishing as events arrive (catch-up cycles)")
    job.add_argument("--bootstrap", default=None, help="Kafka brokers (else KAFKA_BOOTSTRAP, else the local broker)")
    job.add_argument("--group", default="trustbeam-run", help="name of the run's ledger (resume point)")
    job.add_argument("--runner", default="FnApiRunner", help="Beam runner (named explicitly)")
    job.add_argument("--poll-seconds", type=float, default=5.0, help="seconds between --follow cycles")
    job.add_argument("--max-cycles", type=int, default=None, help="stop --follow after this many cycles")
    job.add_argument("--retry-deadline-seconds", type=float, default=600.0,
                     help="retry broker trouble for at most this long since the last successful cycle")
    job.set_defaults(handler=cmd_run, options="pipeline")

    demo = sub.add_parser("demo", help="the main job on embedded defaults: local broker, simulated events")
    _add_sim_options(demo)
    demo.add_argument("--bootstrap", default=None)
    demo.add_argument("--out", default="out/demo")
    demo.add_argument("--epochs", type=int, default=8, help="training epochs for the cached demo model")
    demo.set_defaults(handler=cmd_demo)

    schedule = sub.add_parser("schedule-demo", help="closed loop: a scheduler selects collaborators from the live "
                                                   "topics; achieved VoC against random and oracle selection")
    _add_sim_options(schedule)
    schedule.add_argument("--bootstrap", default=None)
    schedule.add_argument("--epochs", type=int, default=8, help="training epochs for the cached demo model")
    schedule.add_argument("--warmup", type=int, default=32, help="slots run with the random policy first")
    schedule.add_argument("--loop", type=int, default=8, help="slots scheduled from the live topics")
    schedule.set_defaults(handler=cmd_schedule_demo)
    for command in sub.choices.values():  # an abbreviation is a typo waiting to happen: spell options out
        command.allow_abbrev = False
        command.formatter_class = argparse.ArgumentDefaultsHelpFormatter  # --help shows every default
    return parser


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]


class CloseRaceFilter(logging.Filter):
    """Demotes kafka-python 3.0's "Error closing coroutine for cancelled task" to a one-line warning.

    Closing a client sometimes cancels a task whose coroutine its IO loop is still stepping
    (``ValueError: generator already executing``). The library catches it and the client is closed
    either way: no record is lost or repeated, yet it logs a full traceback at ERROR. The record keeps
    its message and the exception's text, without the traceback, at WARNING (shown with ``-v``).
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.getMessage().startswith("Error closing coroutine"):
            record.msg, record.args = f"{record.getMessage()}: {record.exc_info[1]!r}", None
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            return logging.getLogger(record.name).isEnabledFor(logging.WARNING)
        return True


CLOSE_RACE = CloseRaceFilter()  # one instance: main() may run many times in a process, and adds it once


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    passes = getattr(args, "options", None)  # "job": the job's options; "pipeline": Beam's beside them
    if rest and passes is None:
        known = sorted(flag for action in _subparser(parser, args.command)._actions for flag in action.option_strings)
        close = difflib.get_close_matches(rest[0].split("=")[0], known, n=2, cutoff=0.6)
        parser.error(f"unrecognized arguments: {' '.join(rest)}"
                     + (f"; did you mean {' or '.join(close)}?" if close else ""))
    if passes:  # either spelling, and a typo is an error; Beam is imported only where its options pass
        from beam_pipeline.options import job_flags, spelled

        try:
            if passes == "job":
                rest = spelled(rest, job_flags())
            else:
                from beam_pipeline.pipeline_options import checked_pipeline_args

                rest = checked_pipeline_args(rest)
        except ValueError as error:
            parser.error(str(error))
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kafka.net.selector").addFilter(CLOSE_RACE)
    if not args.verbose:  # kafka-python warns about its own event loop under load; errors still show
        logging.getLogger("kafka").setLevel(logging.ERROR)
        logging.getLogger("kafka.cluster").setLevel(logging.CRITICAL)  # "metadata refresh cancelled" on close
    try:
        return args.handler(args, rest) if passes else args.handler(args)
    except (ValueError, RuntimeError, TimeoutError, FileNotFoundError, KafkaError) as error:
        print(f"trustbeam {args.command}: error: {error}", file=sys.stderr)
        return 2


def program() -> None:
    """The ``trustbeam`` command: :func:`main`, then an exit without the interpreter's last collections. Every output
    is closed and flushed by then, and those passes over the objects PyTorch's import made took ~1 s of each
    command's exit (README: *Speed*); ``gc.freeze()`` leaves them to the process's end."""
    code = main()
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    program()
