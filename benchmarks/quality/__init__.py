"""Quality: how close samples come to real data. The digits' Fréchet distance and the toy sets' sliced Wasserstein
distance (quality.py, quality_conditional.py, metrics_lib.py), every sampler against its cost (sampler_sweep.py,
ddim_eta.py), learned variances and post-hoc EMA (learned_variance.py, post_hoc_ema.py), the vector sets
(vectors.py, vector_sets.py) and the first run as the README prints it (first_run.py); train_run.py trains their
recipes as a user would."""
