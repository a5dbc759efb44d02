"""The streaming job (Apache Beam): Kafka in, slot windows, BiMamba scoring, rankings out.

Layer 6: imports ``schemas``, ``model``, ``exporters``, ``simulator`` and ``deploy.local``, never ``trustbeam``.
"""
