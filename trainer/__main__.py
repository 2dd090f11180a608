"""`python -m trainer`: see trainer/train.py.

`python -m trainer --check-args ARGS...` validates ARGS without importing torch: exit 0 silently when
they are valid, else exit 2 with one `ddplab: error: trainer argument ...` line.

The flags are read before torch is imported (about 2 CPU-seconds): `--help` and a bad flag answer at once.
"""

import sys

if __name__ == "__main__":
    if sys.argv[1:2] == ["--check-args"]:
        from trainer.cli import check_args

        problem = check_args(sys.argv[2:])
        if problem:
            print(f"ddplab: error: {problem}", file=sys.stderr)
        sys.exit(2 if problem else 0)
    from trainer.cli import parse_config
    from trainer.config import UsageError

    try:
        parse_config(sys.argv[1:])
    except UsageError as e:
        print(f"ddplab: error: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
    from trainer.train import main

    sys.exit(main())
