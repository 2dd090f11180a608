#!/bin/bash
# Print "<sha256>  <relative path>" for every file of the node's code folder $1, sorted bytewise
# (LC_ALL=C), skipping bytecode, __pycache__/.git/.pytest_cache folders and the .ddplab-code* records.
# sha256 of this output is the code hash (the control host computes the same from its files;
# roles/preflight recomputes it with the same pipeline). A missing folder prints nothing.
set -o pipefail
cd "$1" 2>/dev/null || exit 0
find . \( -name __pycache__ -o -name .git -o -name .pytest_cache \) -prune -o -type f \
  ! -name '*.py[co]' ! -path './.ddplab-code*' -printf '%P\0' | LC_ALL=C sort -z | xargs -0 -r sha256sum --
