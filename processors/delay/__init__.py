"""Delay processor: STAMP records (Kafka) -> per-second delay statistics (line protocol)."""
