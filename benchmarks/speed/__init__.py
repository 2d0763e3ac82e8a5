"""Speed: how fast a recipe trains and samples, and what Lightning costs against plain PyTorch loops and diffusers'
UNet2DModel (speed.py and its parts speed_paths, speed_jobs, speed_data, speed_report, speed_run); the host's own
work per step (host_cost.py), activation checkpointing's memory (activation_memory.py) and compiled DDP
(ddp_compile.py)."""
