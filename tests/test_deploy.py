"""Deployment artifacts checked here: container requirements against setup.py, the Flink manifests and
compose file, the Dataflow template's metadata, and every option they pass against the option classes."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest
import yaml
from apache_beam.options.pipeline_options import PipelineOptions

from deploy.container import requirements
from deploy.dataflow import metadata
from trustbeam.flex_template import flex_args
from trustbeam.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
FLINK = ROOT / "deploy" / "flink"
INSTALL, EXTRAS = requirements.setup_lists()
BEAM_VERSION = next(r.split("==")[1] for r in INSTALL if r.startswith("apache-beam=="))
SLOT_S = 60


def setup_python() -> str:
    return re.search(r'python_requires=">=(\d+\.\d+)', (ROOT / "setup.py").read_text()).group(1)


def known_option(name: str) -> bool:
    """An option of trustbeam (beam_pipeline.options), of `trustbeam run`, or of Beam."""
    trustbeam = {a.dest for a in metadata.option_actions()}
    run = build_parser()._subparsers._group_actions[0].choices["run"]
    cli = {a.dest for a in run._actions}
    return name in trustbeam or name in cli or name in PipelineOptions([]).get_all_options()


def options_of(args: list[str]) -> list[str]:
    return [a[2:].split("=", 1)[0].replace("-", "_") for a in args if a.startswith("--")]


def test_container_requirements_are_setup_pys() -> None:
    expected = requirements.expected()
    for name, text in expected.items():
        assert (ROOT / "deploy" / "container" / name).read_text() == text, f"{name} is stale"
    cpu = expected["requirements.txt"].splitlines()[1:]
    cuda = expected["requirements-cuda.txt"].splitlines()[1:]
    assert cpu == INSTALL + EXTRAS["onnx"] + EXTRAS["cloud"] and cuda == INSTALL + EXTRAS["gpu"] + EXTRAS["cloud"]
    assert not any(r.startswith("onnxruntime") for r in cuda if not r.startswith("onnxruntime-gpu"))


@pytest.mark.parametrize("dockerfile", ["deploy/container/Dockerfile", "deploy/dataflow/Dockerfile"])
def test_dockerfiles_pin_setup_pys_versions_and_ship_every_package(dockerfile: str) -> None:
    text = (ROOT / dockerfile).read_text()
    packages = json.loads(re.search(r"PACKAGES = (\[.*?\])", (ROOT / "setup.py").read_text()).group(1))
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert "COPY . src/" in text and not set(packages) & set(ignored), f"{dockerfile} must ship every package"
    assert "requirements" in text and re.search(r"pip install [^\n]*--no-deps \./src", text)
    if "ARG BEAM_VERSION" in text:
        assert f"ARG BEAM_VERSION={BEAM_VERSION}" in text and f"ARG PYTHON_VERSION={setup_python()}" in text
    else:
        assert f"python{setup_python().replace('.', '')}-template-launcher" in text


def flink_documents() -> dict[str, dict]:
    docs = {}
    for path in sorted(FLINK.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            docs[f"{doc.get('kind', 'compose')}/{doc.get('metadata', {}).get('name', path.stem)}"] = doc
    return docs


def test_flink_deployment_has_what_the_operator_and_beam_need() -> None:
    docs = flink_documents()
    flink = docs["FlinkDeployment/trustbeam-flink"]
    assert flink["apiVersion"] == "flink.apache.org/v1beta1" and flink["metadata"]["namespace"]
    spec = flink["spec"]
    assert spec["image"] and spec["serviceAccount"] and spec["flinkVersion"] == "v1_20"
    for role in ("jobManager", "taskManager"):
        assert spec[role]["resource"]["memory"] and spec[role]["resource"]["cpu"] >= 1
    conf = spec["flinkConfiguration"]
    assert all(isinstance(v, str) for v in conf.values()), "the operator takes string values"
    assert conf["state.backend.type"] == "rocksdb" and conf["restart-strategy.type"] == "exponential-delay"
    assert int(conf["taskmanager.numberOfTaskSlots"]) == spec["taskManager"]["resource"]["cpu"]
    assert 0 < int(conf["execution.checkpointing.interval"].rstrip("s")) < SLOT_S
    containers = {c["name"]: c for c in spec["taskManager"]["podTemplate"]["spec"]["containers"]}
    assert "flink-main-container" in containers
    pool = containers["beam-worker-pool"]
    assert pool["args"] == ["--worker_pool"] and pool["ports"][0]["containerPort"] == 50000
    assert pool["image"].endswith(":0.1.0")  # setup.py's version
    job_server = docs["Deployment/trustbeam-beam-job-server"]["spec"]["template"]["spec"]["containers"][0]
    assert job_server["image"] == f"apache/beam_flink1.20_job_server:{BEAM_VERSION}"
    conf_dir = yaml.safe_load((FLINK / "job-server-conf" / "config.yaml").read_text())
    for key, value in conf_dir.items():
        assert conf[key] == value, f"job-server-conf/config.yaml and the FlinkDeployment disagree on {key}"
    assert "--flink-conf-dir=/opt/beam/flink-conf" in job_server["args"]


def test_the_submitter_passes_only_options_that_exist() -> None:
    docs = flink_documents()
    job = docs["Job/trustbeam-submit"]["spec"]["template"]["spec"]["containers"]
    submit = next(c for c in job if c["name"] == "submit")
    compose = docs["compose/compose"]["services"]["trustbeam"]
    for command in (submit["command"] + submit["args"], compose["entrypoint"] + compose["command"]):
        unknown = [o for o in options_of(command) if not known_option(o)]
        assert not unknown, f"options no parser knows: {unknown}"
        assert "--environment_config=localhost:50000" in command or any("environment_config" in a for a in command)
        assert "--kafka_io=xlang" in command
    env = {e["name"]: e for e in submit["env"]}
    assert "valueFrom" in env["KAFKA_SASL_PASSWORD"], "the password comes from a Secret"
    assert not any("password" in a.lower() for a in submit["args"]), "no secret on the command line"
    expansion = next(c for c in job if c["name"] == "expansion-service")
    assert "--defaultEnvironmentType=PROCESS" in expansion["command"]
    assert f"BEAM_VERSION={BEAM_VERSION}" in (FLINK / "Dockerfile").read_text()


def test_compose_services_reference_each_other_consistently() -> None:
    services = flink_documents()["compose/compose"]["services"]
    for name, service in services.items():
        depends = service.get("depends_on", [])
        assert all(d in services for d in depends), f"{name} depends on a missing service"
    assert services["worker-pool"]["network_mode"] == "service:taskmanager"
    assert services["trustbeam"]["environment"]["KAFKA_BOOTSTRAP"] == "kafka:9092"


def test_dataflow_metadata_describes_every_option_and_only_those() -> None:
    stored = json.loads((ROOT / "deploy" / "dataflow" / "metadata.json").read_text())
    assert stored == metadata.metadata(), "metadata.json is stale: python -m deploy.dataflow.metadata"
    names = [p["name"] for p in stored["parameters"]]
    options = {a.dest for a in metadata.option_actions()} - metadata.LOCAL_ONLY
    assert set(names) == options | {"bootstrap"} and len(names) == len(set(names))
    assert all(p["helpText"] and p["label"] for p in stored["parameters"])
    required = {p["name"] for p in stored["parameters"] if not p["isOptional"]}
    assert required == {"bootstrap", "checkpoint"}
    shards = next(p for p in stored["parameters"] if p["name"] == "shards")
    assert re.fullmatch(shards["regexes"][0], "64") and not re.fullmatch(shards["regexes"][0], "x")


def test_flex_template_parameters_become_a_trustbeam_run() -> None:
    args = flex_args(["--bootstrap=k:9092", "--checkpoint=gs://b/model", "--shards=64",
                      "--sdk_container_image=r/trustbeam-worker:0.1.0"])
    assert args[:6] == ["run", "--follow", "--runner", "DataflowRunner", "--bootstrap", "k:9092"]
    assert "--kafka_io=xlang" in args and "--streaming" in args
    parsed, rest = build_parser().parse_known_args(args)
    assert parsed.command == "run" and parsed.bootstrap == "k:9092"
    assert all(known_option(o) for o in options_of(rest))


def json_patch(document: dict, operations: list[dict]) -> dict:
    """RFC 6902 test/replace/add on a copy (what kustomize applies), failing on a path that does not resolve."""
    import copy

    out = copy.deepcopy(document)
    for op in operations:
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        node = out
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        key = int(last) if isinstance(node, list) else last
        if op["op"] == "test":
            assert node[key] == op["value"], f"{op['path']}: {node[key]!r} is not {op['value']!r}"
        elif op["op"] == "replace":
            assert key in node if isinstance(node, dict) else key < len(node), f"{op['path']}: nothing to replace"
            node[key] = op["value"]
        else:
            assert op["op"] == "add"
            node[key] = op["value"]
    return out


def test_the_gpu_overlay_gives_the_worker_pool_the_cuda_image_and_a_gpu() -> None:
    base = yaml.safe_load((FLINK / "kustomization.yaml").read_text())
    assert base["resources"] == ["flink-deployment.yaml"]
    overlay = yaml.safe_load((FLINK / "gpu" / "kustomization.yaml").read_text())
    assert overlay["resources"] == [".."]
    (patch,) = overlay["patches"]
    flink = flink_documents()["FlinkDeployment/trustbeam-flink"]
    assert patch["target"] == {"kind": "FlinkDeployment", "name": flink["metadata"]["name"]}
    gpu = json_patch(flink, yaml.safe_load(patch["patch"]))
    pods = gpu["spec"]["taskManager"]["podTemplate"]["spec"]
    pool = next(c for c in pods["containers"] if c["name"] == "beam-worker-pool")
    cpu_image = next(c for c in flink["spec"]["taskManager"]["podTemplate"]["spec"]["containers"]
                     if c["name"] == "beam-worker-pool")["image"]
    assert pool["image"] == cpu_image + "-cuda"  # the same release, the Dockerfile's cuda target
    assert pool["resources"]["limits"]["nvidia.com/gpu"] == 1 and pool["resources"]["limits"]["memory"]
    assert pods["nodeSelector"] and pods["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert "AS cuda" in (ROOT / "deploy" / "container" / "Dockerfile").read_text()
