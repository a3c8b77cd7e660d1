"""The runtime: no torch anywhere below this package."""
