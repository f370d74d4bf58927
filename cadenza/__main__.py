"""``python -m cadenza`` is the same as the ``cadenza`` command."""

from cadenza.cli import main

if __name__ == "__main__":
    main()
