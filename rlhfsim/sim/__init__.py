"""SimPy simulator: generation engines, stages, schedules, the Simulation and its summary."""
