"""Outputs of trustbeam: ONNX models for serving, Parquet and Kafka sinks, the schedulers' client."""
