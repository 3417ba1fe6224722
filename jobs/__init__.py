"""Command-line entry points, shipped job configs and assets, and benchmarks."""
