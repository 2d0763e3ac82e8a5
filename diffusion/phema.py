"""`python -m diffusion.phema`: the command lives in `diffusion.cli.phema`."""

from diffusion.cli.phema import main

if __name__ == "__main__":
    main()
