"""Random weights for the live server that make its outputs depend on attention,
and a STANDALONE draft that computes what the target computes.

SGLang's ``--load-format dummy`` fills every weight, norms included, with the
same uniform(-1e-3, 1e-3) draw: a norm then scales activations by about 1e-3,
the attention output added to the residual stream is below bf16's resolution
of it, and the greedy tokens do not depend on the attention backend at all, so
comparing backends by their outputs would test nothing. This module, loaded by
SGLang's plugin loader in each of its processes (``sglang.srt.plugins`` entry
point, written by ``live_server.sh``), replaces that fill when
``LIVE_DUMMY_INIT=1``:

- norm weights 1, other vectors (biases) 0, matrices normal(0, 0.02), as a freshly
  initialised Llama; each tensor drawn from a seed of its name, so the draft's
  embedding, head and first layers equal the target's;
- with ``LIVE_IDENTITY_FROM=N``, the attention output projection and the MLP
  down projection of layers N and above are zero: those layers still run their
  attention and MLP in full (the same work as a trained model's), but add
  nothing, so the target computes what an N-layer draft computes and a
  STANDALONE draft of N layers is accepted as often as greedy rounding allows.

Each process that applies it logs one line ``live_dummy_init: ...``;
``live_server.py`` refuses a run whose log lacks it.
"""

from __future__ import annotations

import os
import re
import sys
import zlib

STD = 0.02
_LAYER = re.compile(r"\.layers\.(\d+)\.")
_SILENT_PROJECTIONS = ("o_proj.weight", "down_proj.weight")


def identity_from() -> int | None:
    value = os.environ.get("LIVE_IDENTITY_FROM", "")
    return int(value) if value else None


def fill_weights(model, seed: int = 0) -> dict:
    """Fills ``model``'s floating-point parameters in place (see the module doc);
    returns counts of what was filled how."""
    import torch

    first_silent = identity_from()
    counts = {"ones": 0, "zeros": 0, "normal": 0, "silenced": 0}
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not torch.is_floating_point(param):
                continue
            layer = _LAYER.search(name)
            if param.dim() == 1:
                kind = "ones" if "norm" in name and name.endswith("weight") else "zeros"
                param.fill_(1.0 if kind == "ones" else 0.0)
            elif (first_silent is not None and layer and int(layer.group(1)) >= first_silent
                  and name.endswith(_SILENT_PROJECTIONS)):
                kind = "silenced"
                param.zero_()
            else:
                kind = "normal"
                generator = torch.Generator(device=param.device)
                generator.manual_seed(zlib.crc32(f"{seed}:{name}".encode()))
                param.normal_(0.0, STD, generator=generator)
            counts[kind] += 1
    return counts


def initialize_live_weights(model, *args, **kwargs) -> None:
    """Stands in for ``initialize_dummy_weights(model)``."""
    counts = fill_weights(model)
    # Straight to stderr (the server log): SGLang's logging setup decides nothing here.
    print(f"live_dummy_init: {type(model).__name__} filled {counts} "
          f"(identity from layer {identity_from()})", file=sys.stderr, flush=True)


def register() -> None:
    """SGLang plugin entry: swaps the dummy loader's fill when LIVE_DUMMY_INIT=1."""
    if os.environ.get("LIVE_DUMMY_INIT", "0") in ("", "0"):
        return
    from sglang.srt.model_loader import loader, weight_utils

    loader.initialize_dummy_weights = initialize_live_weights
    weight_utils.initialize_dummy_weights = initialize_live_weights
