"""Results of runs: the results folder, summary by area, plots, HTML reports, sweeps and comparisons."""
