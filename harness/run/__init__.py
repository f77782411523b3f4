"""Running many scenarios through many backends: plans, scheduling, evaluation."""
