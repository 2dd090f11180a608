#!/bin/bash
# Print "<python> <torch version or ->" for each candidate interpreter and the venv's python, one a line.
# A candidate counts only when torch, numpy and pyarrow all import.
for py in "$@"; do
  if ! command -v "$py" >/dev/null 2>&1; then echo "$py -"; continue; fi
  ver=$("$py" -c 'import numpy, pyarrow, torch; print(torch.__version__.split("+")[0])' 2>/dev/null) || ver=-
  echo "$(command -v "$py") ${ver:--}"
done
