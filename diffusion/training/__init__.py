"""Training: the LightningModule (`DiffusionModule`: loss, optimizer, sampling entry points), its options, the
optimizer schedule, random states, post-hoc EMA, checkpoint files and run folders, and the callbacks (`callbacks/`).
`load_checkpoint` builds a trained model from its checkpoint alone."""
