"""ddplab control-side tools: the merged run report and a live follow of every node's tmux pane."""
