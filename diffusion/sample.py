"""`python -m diffusion.sample`: the command lives in `diffusion.cli.sample`."""

from diffusion.cli.sample import main

if __name__ == "__main__":
    main()
