"""`python -m diffusion.export`: the command lives in `diffusion.cli.export`."""

from diffusion.cli.export import main

if __name__ == "__main__":
    main()
