"""The Flex Template's ``metadata.json``, generated from the pipeline's option class so that every
option is described there and no parameter names an option the job lacks.

    python -m deploy.dataflow.metadata           # rewrite metadata.json
    python -m deploy.dataflow.metadata --check   # exit 1 if it is stale
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

PATH = Path(__file__).resolve().parent / "metadata.json"
REQUIRED = {"checkpoint", "bootstrap"}
LOCAL_ONLY = {"kafka_io"}  # the template always runs the xlang path
_KIND = {int: ("^[0-9]+$", "an integer"), float: ("^[0-9]+([.][0-9]+)?$", "a number")}


def option_actions() -> list[argparse.Action]:
    from beam_pipeline.options import add_job_arguments

    parser = argparse.ArgumentParser()
    add_job_arguments(parser)
    return [a for a in parser._actions if a.dest != "help"]


def metadata() -> dict:
    parameters = [{"name": "bootstrap", "label": "Kafka brokers",
                   "helpText": "host:port[,host:port...] of the Kafka brokers; SASL/TLS settings come from the "
                               "launcher environment (KAFKA_SECURITY_PROTOCOL, KAFKA_SASL_*, KAFKA_SSL_*)",
                   "isOptional": False}]
    for action in option_actions():
        if action.dest in LOCAL_ONLY:
            continue
        entry = {"name": action.dest, "label": action.dest.replace("_", " "),
                 "helpText": action.help + (f" (default: {action.default})" if action.default is not None else ""),
                 "isOptional": action.dest not in REQUIRED}
        if action.type in _KIND:
            entry["regexes"] = [_KIND[action.type][0]]
        if action.choices:
            entry["regexes"] = ["^(" + "|".join(action.choices) + ")$"]
        parameters.append(entry)
    return {"name": "trustbeam", "description": "trustbeam streaming job: collaboration events from Kafka -> "
            "BM long-term trust (GNN + bidirectional Mamba) -> trust scores and collaborator rankings to Kafka",
            "streaming": True, "supportsExactlyOnce": True, "sdkInfo": {"language": "PYTHON"},
            "parameters": parameters}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    text = json.dumps(metadata(), indent=2) + "\n"
    if args.check:
        if not PATH.exists() or PATH.read_text() != text:
            print("stale: deploy/dataflow/metadata.json; run python -m deploy.dataflow.metadata", file=sys.stderr)
            return 1
        return 0
    PATH.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
