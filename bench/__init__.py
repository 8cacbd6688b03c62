"""Benchmarks and the real-model corpus they (and the tests) run on."""
