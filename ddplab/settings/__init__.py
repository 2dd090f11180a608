"""ddplab's settings: one typed spec of every ddplab_* name (spec.py), the checks run before a node is
touched (`python -m ddplab validate`), and the files generated from the spec (`python -m ddplab settings`)."""


def add_parser(sub) -> None:
    """Register the verbs `validate` and `settings`."""
    from ddplab.settings import generate, validate

    validate.add_parser(sub)
    generate.add_parser(sub)
