"""One experiment run from spec to results folder: preparing, running, background traffic, progress and the plan printout."""
