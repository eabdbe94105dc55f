"""kernels: the CUDA C sources (package data), their NVRTC compile and cache, and the launcher that runs a
plan's stages on a GPU, counting or plain builds (imports plan/ and simulate/ for device inputs).

:mod:`.sources` builds each translation unit, :mod:`.stages` maps a plan's stages to kernels and defines,
:mod:`.nvrtc` compiles without a GPU, :mod:`.launch` allocates, launches and counts, :mod:`.timing` times
(CUDA-graph replays, CUDA events), :mod:`.rawlaunch` launches prepared stages on raw addresses,
:mod:`.runtime` finds cupy and the cache folders. Importing this package needs neither cupy nor a GPU.
"""
