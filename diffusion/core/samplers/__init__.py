"""The samplers, one file per family, as numbered steps citing their papers; `contract.py` is what every sampler
is and is given, `spacing.py` the timesteps they visit. They are registered in `diffusion.core.sampling.SAMPLERS`."""
