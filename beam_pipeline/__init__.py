"""The streaming job (Apache Beam): Kafka in, slot windows, BiMamba scoring, rankings out."""
