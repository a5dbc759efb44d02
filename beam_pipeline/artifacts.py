"""Model artifacts from a URI: a local directory, or any filesystem Beam supports (``gs://``, ``s3://``,
``hdfs://``, ... with the matching Beam extra installed on the workers).

A remote artifact is copied once per process host into ``$TRUSTBEAM_STATE_DIR/artifacts/<digest>``,
where the digest is that of the artifact's manifest (``config.json`` of a checkpoint, ``manifest.json``
of an ONNX export): a changed artifact gets a new copy, an unchanged one is reused. The copy is made
in a staging directory renamed into place, and the loaders verify every file's hash afterwards
(:func:`model.checkpoint.load`, :class:`exporters.onnx.OnnxStages`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from model.checkpoint import staged_directory
from model.config import state_dir

CHECKPOINT_FILES = ("config.json", "weights.pt", "node2vec.npy")
ONNX_FILES = ("manifest.json", "gnn.onnx", "sequence.onnx", "head.onnx")


def is_remote(uri: str) -> bool:
    return "://" in uri and not uri.startswith("file://")


def _local(uri: str) -> Path:
    return Path(uri.removeprefix("file://"))


def exists(uri: str, name: str) -> bool:
    """Whether ``uri``/``name`` exists (the artifact's manifest: checked before a job is submitted)."""
    if not is_remote(uri):
        return (_local(uri) / name).is_file()
    from apache_beam.io.filesystems import FileSystems

    try:
        return FileSystems.exists(FileSystems.join(uri, name))
    except ValueError:  # no Beam filesystem for this scheme (a missing extra)
        raise ValueError(f"{uri!r}: no Beam filesystem handles this scheme here; install the matching "
                         "apache-beam extra (gcp, aws, azure, hadoop)") from None


def read(uri: str, name: str) -> bytes:
    """The bytes of ``uri``/``name``."""
    if not is_remote(uri):
        return (_local(uri) / name).read_bytes()
    from apache_beam.io.filesystems import FileSystems

    with FileSystems.open(FileSystems.join(uri, name)) as handle:
        return handle.read()


def content_hash(uri: str) -> str:
    """The content hash a checkpoint's manifest records (what ``model_version`` abbreviates)."""
    return json.loads(read(uri, CHECKPOINT_FILES[0]))["content_hash"]


def localize(uri: str, files: tuple[str, ...]) -> Path:
    """A local directory holding the artifact's ``files`` (the first is its manifest)."""
    if not is_remote(uri):
        return _local(uri)
    manifest = read(uri, files[0])
    target = state_dir() / "artifacts" / hashlib.sha256(manifest).hexdigest()[:24]
    if not (target / files[0]).is_file():
        with staged_directory(target, replace=False) as staging:  # content-addressed: the first copy wins
            (staging / files[0]).write_bytes(manifest)
            for name in files[1:]:
                (staging / name).write_bytes(read(uri, name))
    return target
