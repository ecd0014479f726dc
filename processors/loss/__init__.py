"""Loss processor: alternate-marking block records (Kafka) -> per-flow, per-block loss (line protocol)."""
