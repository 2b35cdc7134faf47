"""Apache Kafka from Maven Central jars, for tests and local runs (``python -m ops.kafka``).

``available()`` says whether it can run here; ``ApacheKafka`` starts one KRaft node.
"""

from __future__ import annotations

from ops.kafka.broker import ApacheKafka
from ops.kafka.jars import KAFKA_VERSION, KafkaError, collect_jars, jars_dir, missing


def available(version: str = KAFKA_VERSION) -> str | None:
    """None when Apache Kafka can run here (Java >= 17, and mvn or collected jars);
    else the reason it cannot."""
    return missing(version)


__all__ = ["KAFKA_VERSION", "ApacheKafka", "KafkaError", "available", "collect_jars", "jars_dir"]
