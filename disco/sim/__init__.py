"""The simulator: cluster specs, costs, collectives, XLA fusion emulation and scheduling."""
