"""Experiment and topology specs: the pydantic models (one module per concern), human units,
YAML loading and --set (load.py). Pure."""
