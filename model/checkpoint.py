"""BM checkpoints: weights + JSON config + node2vec table + device index, sealed by a content hash.

A checkpoint is a directory::

    config.json     format, BMConfig, device ids, metadata, sha256 of each file, content hash
    weights.pt      the state dict (tensors only; loaded with torch.load(weights_only=True))
    node2vec.npy    the (devices, dim) node2vec table (loaded with allow_pickle=False)

The content hash covers the config, the device ids and both files; loading
recomputes it and refuses any mismatch, so ``model_version`` (``bm-`` + 12 hex
digits of it) names exactly what scored. Writes go to a temporary directory
renamed into place.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, get_type_hints

import numpy as np
import torch

from model.bm import BM, BMConfig
from model.graphs import DeviceIndex

FORMAT = "trustbeam-bm/10"  # 2: the head reads the load's drift (evidence.load_drift); 3: its memory (load_memory);
#                           4: the task size's correction and its evidence (experts.SizeCorrection, evidence.SIZED);
#                           5: what the credibility did not let in, of a collaborator and from it (discredited_block);
#                           6: the size evidence by size class, split at the training period's typical size
#                           (evidence.size_x); 7: claimed CPUs judged against the speeds tasks showed
#                           (evidence.verified_cpu, EvidenceConfig.speed_gap); 8: the physics' offload computed at the
#                           share of the collaborator's CPU its reported load leaves free (context.pair_physics);
#                           9: the head's physics reads that load raised by the part of its last fall that is
#                           doubted (evidence.credited_load); 10: the rule as an expert of the stack
#                           (experts.RuleExperts.adopt_rule)
_DERIVED = ("features", "level_values")  # stored elsewhere or recomputed


class CheckpointError(ValueError):
    """A checkpoint is missing, altered, or does not fit what the caller expects."""


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _content_hash(config: dict[str, Any], ids: list[str], files: dict[str, str]) -> str:
    body = json.dumps({"config": config, "ids": ids, "files": files}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()


def model_version(content_hash: str) -> str:
    return f"bm-{content_hash[:12]}"


def config_to_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)


def config_from_dict(cls: type, data: dict[str, Any], where: str = "config") -> Any:
    """Rebuild a (nested) frozen dataclass from JSON, refusing unknown or missing fields."""
    if not isinstance(data, dict):
        raise CheckpointError(f"{where}: expected an object (got {data!r})")
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(data) - set(fields)
    if unknown:
        raise CheckpointError(f"{where}: unknown fields {sorted(unknown)}")
    values = {}
    for name, value in data.items():
        kind = hints[name]
        if dataclasses.is_dataclass(kind):
            values[name] = config_from_dict(kind, value, f"{where}.{name}")
        elif isinstance(value, list):
            values[name] = tuple(value)
        else:
            values[name] = value
    try:
        return cls(**values)
    except (TypeError, ValueError) as error:
        raise CheckpointError(f"{where}: {error}") from None


def read_manifest(root: Path, name: str, fmt: str, error: type[Exception], missing: str) -> dict[str, Any]:
    """An artifact's JSON manifest, checked for its format; ``error`` (with ``missing`` when absent) otherwise."""
    try:
        manifest = json.loads((root / name).read_text())
    except FileNotFoundError:
        raise error(f"{root}: {missing}") from None
    except json.JSONDecodeError as decode_error:
        raise error(f"{root}/{name}: not JSON ({decode_error})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != fmt:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise error(f"{root}: format {found!r} is not {fmt!r}")
    return manifest


def save(model: BM, index: DeviceIndex, directory: str | os.PathLike[str], metadata: dict[str, Any] | None = None
         ) -> str:
    """Write a checkpoint; returns its content hash."""
    with staged_directory(Path(directory)) as staging:
        weights = {k: v.cpu() for k, v in model.state_dict().items() if k not in _DERIVED}  # loadable anywhere
        torch.save(weights, staging / "weights.pt")
        np.save(staging / "node2vec.npy", model.features.cpu().numpy(), allow_pickle=False)
        files = {name: file_sha256(staging / name) for name in ("weights.pt", "node2vec.npy")}
        config = config_to_dict(model.config)
        content = _content_hash(config, list(index.ids), files)
        manifest = {"format": FORMAT, "config": config, "ids": list(index.ids), "files": files,
                    "content_hash": content, "model_version": model_version(content), "metadata": metadata or {}}
        (staging / "config.json").write_text(json.dumps(manifest, indent=1))
    return content


@contextmanager
def staged_directory(target: Path, replace: bool = True) -> Iterator[Path]:
    """A fresh hidden directory beside ``target``, renamed onto it when the block succeeds, else removed.

    The rename is atomic and nothing is deleted before it: an existing target is first renamed aside,
    then the new directory takes its name, then the old one is removed, so a reader finds a complete
    directory at every moment but the instant between the two renames (and retries through it).
    Concurrent writers each commit in turn; with ``replace=False`` (content-addressed targets, where
    every writer writes the same bytes) the first writer's copy stays and later ones are discarded.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        yield staging
        _commit(staging, target, replace)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _commit(staging: Path, target: Path, replace: bool, attempts: int = 100) -> None:
    for _ in range(attempts):
        try:
            os.rename(staging, target)  # fails while a non-empty target exists
            return
        except OSError:
            if not target.exists():
                continue  # another writer was between its two renames
            if not replace:
                shutil.rmtree(staging, ignore_errors=True)
                return
            aside = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
            try:
                os.rename(target, aside)
            except OSError:
                continue  # another writer set it aside first
            try:
                os.rename(staging, target)
                return
            except OSError:
                continue  # another writer's copy went in between: set that one aside in turn
            finally:
                shutil.rmtree(aside, ignore_errors=True)
    raise OSError(f"{target}: could not put the new directory in place after {attempts} attempts")


def load(directory: str | os.PathLike[str], expect: dict[str, Any] | None = None
         ) -> tuple[BM, DeviceIndex, dict[str, Any]]:
    """Load and verify a checkpoint. ``expect`` maps config fields (e.g. ``clock``) to required values."""
    root = Path(directory)
    manifest = read_manifest(root, "config.json", FORMAT, CheckpointError, "not a checkpoint (no config.json)")
    files = {name: file_sha256(root / name) for name in ("weights.pt", "node2vec.npy") if (root / name).exists()}
    if files != manifest.get("files"):
        raise CheckpointError(f"{root}: file hashes do not match the manifest (altered or incomplete)")
    if _content_hash(manifest["config"], manifest["ids"], files) != manifest.get("content_hash"):
        raise CheckpointError(f"{root}: content hash does not match the config and files")
    config = config_from_dict(BMConfig, manifest["config"])
    for name, wanted in (expect or {}).items():
        if getattr(config, name) != wanted:
            raise CheckpointError(f"{root}: config.{name} is {getattr(config, name)!r}, expected {wanted!r}")
    features = np.load(root / "node2vec.npy", allow_pickle=False)
    index = DeviceIndex(tuple(manifest["ids"]))
    if features.shape != (len(index), config.node2vec.dim):
        raise CheckpointError(f"{root}: node2vec table {features.shape} does not fit {len(index)} devices")
    model = BM(config, features)
    try:
        state = torch.load(root / "weights.pt", weights_only=True)
    except Exception as error:  # pickle.UnpicklingError and kin: anything but plain tensors is refused
        raise CheckpointError(f"{root}/weights.pt: refused, not a plain tensor file (weights-only loading): "
                              f"{str(error).splitlines()[0][:200]}") from None
    expected = set(model.state_dict()) - set(_DERIVED)
    if set(state) != expected:
        raise CheckpointError(f"{root}: weights do not fit the config (missing {sorted(expected - set(state))[:3]}, "
                              f"unexpected {sorted(set(state) - expected)[:3]})")
    try:
        model.load_state_dict(state, strict=False)
    except RuntimeError as error:
        raise CheckpointError(f"{root}: weights do not fit the config: {error}") from None
    model.eval()
    return model, index, manifest
