"""``python -m tokenfeed``: the same command line as the ``tokenfeed`` console script."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
