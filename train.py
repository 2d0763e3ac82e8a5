"""Train a DDPM: `python train.py [--config configs/NAME.yaml] [--devices N --strategy ddp] [--help]`."""

from diffusion.starting import stopping_while_starting

with stopping_while_starting(__name__):  # Ctrl+C while torch and the rest import: one line, not a traceback
    from diffusion.cli.train import main

if __name__ == "__main__":
    main()
