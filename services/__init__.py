"""segscope local services (Kafka, InfluxDB, Telegraf): see services/stack.py."""
