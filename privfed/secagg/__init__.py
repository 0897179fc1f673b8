"""SecAgg+'s pure parts: the run's settings, the mask PRG and the update encoding (Flower's glue is in privfed.federation)."""
