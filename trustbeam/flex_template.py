"""The Dataflow Flex Template's entry point (``deploy/dataflow/Dockerfile``): template parameters -> ``trustbeam run``
on DataflowRunner.

Dataflow passes every parameter as ``--name=value``. ``bootstrap`` names the Kafka brokers (security
settings come from the launcher's environment, never from parameters); everything else is a pipeline
option (trustbeam's, beam_pipeline/options.py, or Beam's/Dataflow's). The job is the unbounded
``--kafka_io=xlang`` pipeline.
"""

from __future__ import annotations

import sys

from trustbeam.cli import main


def flex_args(argv: list[str]) -> list[str]:
    """Template parameters -> the ``trustbeam run`` command line."""
    run = ["run", "--follow", "--runner", "DataflowRunner"]
    options = []
    for arg in argv:
        if arg.startswith("--bootstrap="):
            run += ["--bootstrap", arg.split("=", 1)[1]]
        else:
            options.append(arg)
    if not any(a.startswith("--kafka_io=") for a in options):
        options.append("--kafka_io=xlang")
    return run + ["--streaming", *options]


if __name__ == "__main__":
    sys.exit(main(flex_args(sys.argv[1:])))
