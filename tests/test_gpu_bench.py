"""bench/gpu_bench.py at toy size: every backend gets a row, measured or saying why not, and the measured agree."""

from __future__ import annotations

from bench.gpu_bench import BACKENDS, encoder_rows


def test_every_backend_gets_a_row_and_the_measured_ones_agree(tmp_path) -> None:
    rows = encoder_rows([8], [64], cpu_devices=64, repeats=1, work=tmp_path, onnx_cpu_devices=32)
    assert [r["backend"] for r in rows] == list(BACKENDS)
    measured = [r for r in rows if "skipped" not in r]
    assert {"torch cpu", "onnxruntime cpu"} <= {r["backend"] for r in measured}
    for row in measured:
        assert row["devices"] == (32 if row["backend"] == "onnxruntime cpu" else 64)
        assert row["devices_per_s"] > 0 and row["max_abs_diff"] < 1e-4
    assert all(r["skipped"] for r in rows if "skipped" in r)  # a reason, never a silent gap


def test_a_slot_row_scores_a_synthetic_fleet_and_a_missing_gpu_is_named(tmp_path) -> None:
    import torch

    from bench.gpu_bench import slot_rows

    # two pieces on threads (that they score what one does: tests/test_scoring.py)
    cpu, cpu_head, cuda, _ = slot_rows([300], ["cpu", "cuda"], tmp_path, pieces=(2,), models=("encoder", "head"))
    assert cpu["devices"] == 300 and cpu["trust_scores"] > 0 and cpu["devices_per_s"] > 0 and cpu["pieces"] == 2
    assert (cpu["model"], cpu_head["model"]) == ("encoder", "head") and cpu_head["trust_scores"] == cpu["trust_scores"]
    assert ("skipped" in cuda) != torch.cuda.is_available()


def test_the_lease_scripts_parse_and_name_only_files_that_exist() -> None:
    import re
    import subprocess
    from pathlib import Path

    root = Path(__file__).parent.parent
    scripts = sorted((root / "bench" / "gpu_lease").glob("*.sh"))
    assert {s.name for s in scripts} >= {"prepare.sh", "common.sh", "check.sh", "encoder.sh"}
    for path in scripts:
        assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0, path.name
    for path in (root / "bench" / "gpu_lease" / "check.sh", root / "bench" / "gpu_lease" / "encoder.sh"):
        assert 'source "$(dirname "$0")/common.sh"' in path.read_text()  # one install and build, shared
    named = re.findall(r"tests/\w+\.py", (root / "bench" / "gpu_lease" / "check.sh").read_text())
    assert named and all((root / name).is_file() for name in named)
