"""The commands: `train` (LightningCLI), `sample`, `evaluate`, `export`, `phema`; the flags they share and the
checks made before any time is spent, the one-line report of a user error, and the process group a command
opened."""
