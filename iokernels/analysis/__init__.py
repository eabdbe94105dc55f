"""analysis: the research user's tools: ``compare`` (measured vs predicted bytes), sweeps and exponent fits,
Nsight Compute profiles, compute-sanitizer runs, report tables and plots. Imports plan/, model/, simulate/
and kernels/.
"""
