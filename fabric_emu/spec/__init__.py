"""Experiment and topology specs: the pydantic models, human units, YAML loading and --set. Pure."""
