"""fabric-emu from Python (docs/python-api.md): build an Experiment from a YAML file or a dict,
override it as `--set` does, run it, and read results folders as Results or Sweep, whose tables
are pandas DataFrames.

    from fabric_emu.api import Experiment, load
    results = Experiment.from_file("experiments/quickstart.yaml").run(out="results")
    results.summary["busbw_gbps"], results.flows.completion_fabric_us.max()

Importing this package does not import pandas; the first frame asked for does.
"""

from fabric_emu.api.experiment import Experiment, RunError
from fabric_emu.api.results import FRAME_NAMES, Results, Sweep, load
from fabric_emu.run.progress import ProgressEvent
from fabric_emu.spec.errors import SpecError

__all__ = ["Experiment", "FRAME_NAMES", "ProgressEvent", "Results", "RunError", "SpecError", "Sweep", "load"]
