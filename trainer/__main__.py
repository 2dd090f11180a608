"""`python -m trainer`: see trainer/train.py.

`python -m trainer --check-args ARGS...` validates ARGS without importing torch: exit 0 silently when
they are valid, else exit 2 with one `ddplab: error: trainer argument ...` line.
"""

import sys

if __name__ == "__main__":
    if sys.argv[1:2] == ["--check-args"]:
        from trainer.config import check_args

        problem = check_args(sys.argv[2:])
        if problem:
            print(f"ddplab: error: {problem}", file=sys.stderr)
        sys.exit(2 if problem else 0)
    from trainer.train import main

    sys.exit(main())
