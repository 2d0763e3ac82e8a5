"""`python -m diffusion.evaluate`: the command lives in `diffusion.cli.evaluate`."""

from diffusion.starting import stopping_while_starting

with stopping_while_starting(__name__):  # Ctrl+C while torch and the rest import: one line, not a traceback
    from diffusion.cli.evaluate import main

if __name__ == "__main__":
    main()
