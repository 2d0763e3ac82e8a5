"""The diffusion itself, torch only (no Lightning): noise schedules, the reverse processes (one file per sampler
family), classifier-free guidance and counter-based noise."""
