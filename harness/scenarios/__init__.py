"""What to verify: scenarios, their materialization from a seed, the catalog, profiles, Hypothesis strategies."""
