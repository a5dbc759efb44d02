"""Outputs of trustbeam: ONNX models for serving, Parquet and Kafka sinks, the schedulers' client.

Layer 3: Kafka settings, topics and clients live here (:mod:`exporters.kafka_client`); imports only
``schemas`` and ``model``.
"""
