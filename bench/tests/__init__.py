"""Tests of the benchmarks' own logic, and the short runs of the fault suite and the equal-budget eval on the test stack."""
