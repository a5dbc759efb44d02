"""The local Kafka-protocol broker used for local runs and the tests."""
