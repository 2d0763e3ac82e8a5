"""`python -m diffusion.prepare`: the command lives in `diffusion.cli.prepare`."""

from diffusion.cli.prepare import main

if __name__ == "__main__":
    main()
