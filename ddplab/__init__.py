"""ddplab: the control-side package (everything that runs on the control host); verbs in __main__.py."""
