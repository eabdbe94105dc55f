"""bench: throughput of iokernels beside its peers (``iokernels bench``) and per kernel stage
(``iokernels kernel-bench``). Imports plan/, model/, kernels/ and library/.
"""
