"""Generation on one or many ranks (the rank/index rule once), under autocast or not, and model units turned into
uint8 images, grids, scatter plots and `samples.npz`."""
