"""Train a DDPM: `python train.py [--config configs/NAME.yaml] [--devices N --strategy ddp] [--help]`."""

from diffusion.cli.train import main

if __name__ == "__main__":
    main()
