"""The fault-injection suite (issue 11): ``python -m bench.faults``.

Streams a workload per scenario while one fault is injected into the running embedded stack, waits
until the system settles, and checks the delivery guarantees against what was produced; then
produces the hostile corpus. Modules: workload (what is produced), stream (producing it), inject
and scenarios (the faults), settle (waiting), observe (reading back), invariants (the checks),
hostile (the crafted records), runner (one scenario), report (JSON, PNG, markdown).
"""
