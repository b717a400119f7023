"""Faults, fuzzing and abuse against real clusters: the CI-sized runs and the long runs by hand."""
