"""ONNX export of BM's three inference stages and the onnxruntime scorer that runs them.

``trustbeam export-onnx --checkpoint DIR [--out DIR/onnx]`` writes ``gnn.onnx``, ``sequence.onnx``,
``head.onnx`` and ``manifest.json``; :class:`OnnxStages` loads them behind :class:`model.stages.Stages`.
"""

from exporters.onnx.export import FORMAT, export_onnx
from exporters.onnx.runtime import OnnxModelError, OnnxStages

__all__ = ["FORMAT", "OnnxModelError", "OnnxStages", "export_onnx"]
