"""`python -m trainer`: see trainer/train.py."""

import sys

from trainer.train import main

if __name__ == "__main__":
    sys.exit(main())
