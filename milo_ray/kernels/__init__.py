"""Pure array kernels: one concept per module, no I/O, no Ray, inputs never mutated.

Vectorized numpy/scipy throughout, except the two sequential 3-D hypervolume
sweeps, which are compiled with numba (``_sweep3d``, loaded on first use).

* ``pareto``      fitness vectors, pass-primary epsilon-dominance, admission, parent selection (MILO §4.2)
* ``hypervolume`` exact hypervolume, exclusive contributions, delta-HV (MILO §4.2)
* ``submodular``  clipped-cosine coverage and the RER greedy order, evidence prefix sizes (SSR §4.1-4.2)
* ``autocorr``    EinsteinArena scores, smoothed objectives, exact verification (MILO App. E)
* ``metrics``     pass@k, PR@k, RR@k and task-clustered intervals (MILO §5.2)
"""
