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

CHECKPOINT_MANIFEST = "config.json"  # each artifact's manifest lists its other files (``files``: name -> sha256)
ONNX_MANIFEST = "manifest.json"


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
    return json.loads(read(uri, CHECKPOINT_MANIFEST))["content_hash"]


def localize(uri: str, manifest_name: str) -> Path:
    """A local directory holding the artifact: its manifest and the files the manifest lists (a model that reads no
    Y is exported without the encoder's graphs)."""
    if not is_remote(uri):
        return _local(uri)
    manifest = read(uri, manifest_name)
    target = state_dir() / "artifacts" / hashlib.sha256(manifest).hexdigest()[:24]
    if not (target / manifest_name).is_file():
        with staged_directory(target, replace=False) as staging:  # content-addressed: the first copy wins
            (staging / manifest_name).write_bytes(manifest)
            for name in json.loads(manifest).get("files", {}):  # the loaders check each file's sha256
                (staging / name).write_bytes(read(uri, name))
    return target
