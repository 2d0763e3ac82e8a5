"""`python -m diffusion.evaluate`: the command lives in `diffusion.cli.evaluate`."""

from diffusion.cli.evaluate import main

if __name__ == "__main__":
    main()
