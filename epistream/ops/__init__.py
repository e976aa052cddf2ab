"""Running the stack: the composition root that builds each process's clients, health probes and
readiness waits, tenants' logins and ACLs, the broker's certificates."""
