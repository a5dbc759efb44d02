"""The ``trustbeam`` command line. Each subcommand is a thin adapter over the library."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Callable

from simulator.config import ChannelModel, Policy, SimConfig, parse_mix

Handler = Callable[[argparse.Namespace], int]


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
    parser.add_argument("--status-every", type=int, default=defaults.status_every,
                        help="emit device status every this many slots")


def sim_config(args: argparse.Namespace) -> SimConfig:
    extra = {"mix": parse_mix(args.mix)} if args.mix else {}
    return SimConfig(devices=args.devices, tasks=args.tasks, slots=args.slots, seed=args.seed, area_m=args.area,
                     range_m=args.range_m, policy=Policy(args.policy), channel=ChannelModel(args.channel),
                     status_every=args.status_every, **extra)


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
        from trustbeam.kafka import KafkaSettings, Topics, ensure_topics

        settings = KafkaSettings.resolve(args.bootstrap)
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
    from trustbeam.kafka import Topics, ensure_topics

    broker = LocalBroker(port=args.port)
    if args.action == "start":
        status = broker.start()
        created = ensure_topics(broker.settings, Topics().partitions())
        print(status, f"; topics created: {', '.join(created) or 'none (all existed)'}")
    elif args.action == "stop":
        print("stopped" if broker.stop() else "not running", broker.bootstrap)
    else:
        status = broker.status()
        print(status)
        return 0 if status.answering else 3
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Start the local broker (unless KAFKA_BOOTSTRAP is set), publish a simulated run, read it back."""
    from deploy.local.broker import LocalBroker
    from schemas import CollaborationEvent, ValidationError, from_json
    from simulator.engine import Simulator
    from simulator.parquet_sink import ParquetSink
    from simulator.publish import KafkaPublisher
    from trustbeam.kafka import KafkaSettings, Topics, ensure_topics, read_to_end

    settings = KafkaSettings.resolve(args.bootstrap)
    if settings.is_local:
        print(LocalBroker().start())
    topics = Topics()
    ensure_topics(settings, topics.partitions())
    before = len(read_to_end(settings, topics.events))
    publisher = KafkaPublisher(settings)
    started = time.perf_counter()
    summary = Simulator(sim_config(args)).run([publisher, ParquetSink(args.out)], progress=sys.stderr.isatty())
    published_s = time.perf_counter() - started
    records = read_to_end(settings, topics.events)[before:]
    invalid = 0
    for record in records:
        try:
            from_json(CollaborationEvent, record.value)
        except ValidationError:
            invalid += 1
    report = {**summary.as_dict(), **publisher.counts(), "publish_seconds": round(published_s, 3),
              "consumed_back": len(records), "invalid_consumed": invalid, "bootstrap": settings.bootstrap,
              "files": str(Path(args.out).resolve())}
    print(json.dumps(report, indent=2))
    return 0 if len(records) == summary.events and not invalid else 1


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

    demo = sub.add_parser("demo", help="the main job on embedded defaults: local broker, simulated events")
    _add_sim_options(demo)
    demo.add_argument("--bootstrap", default=None)
    demo.add_argument("--out", default="out/demo")
    demo.set_defaults(handler=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.handler(args)
    except (ValueError, RuntimeError, TimeoutError, FileNotFoundError) as error:
        print(f"trustbeam {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
