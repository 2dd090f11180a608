"""The JSON spec on stdin that drives a node step (preflight-*, launch-facts, start-rank, place-files)."""

from __future__ import annotations

import json


class SpecError(ValueError):
    """The spec is unusable: the command exits 2 with this one line."""


def read_spec(text: str, needs: tuple[str, ...] = ()) -> dict:
    """The spec as a dict, with every key of ``needs`` present and non-empty."""
    try:
        spec = json.loads(text)
    except ValueError as e:
        raise SpecError(f"the spec on stdin is not JSON ({e})") from None
    if not isinstance(spec, dict):
        raise SpecError("the spec on stdin is not a JSON object")
    missing = [k for k in needs if spec.get(k) in (None, "")]
    if missing:
        raise SpecError(f"the spec on stdin has no {', '.join(missing)}")
    return spec
