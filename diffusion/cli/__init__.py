"""The commands: `train` (LightningCLI), `sample`, `evaluate`; the checks made before any time is spent, the
one-line report of a user error, and the process group a command opened."""
