"""The law side: which checks a scenario gets, their statistics, and the run's family rule (Holm)."""
