"""What every process shares beyond the settings and the contracts: tenant claims, date repair, entity
names, the retry policy, the metrics and the tracing. It imports no client of a service."""
