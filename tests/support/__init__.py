"""Helpers shared by the unit and integration tests, the scenario suite and the benchmarks."""
