"""Kafka: clients built from one set of options, the topics and their configs, dead letters, the record
of forgotten conversations, and which topic a tenant hears back on."""
