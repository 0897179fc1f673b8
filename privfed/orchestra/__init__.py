"""Orchestra (Lubana et al., ICML 2022), independent of the FL runtime."""
