"""An independent reference model of the protocol, its property catalogue, and the map
from troth's stores onto it, for the differential tests (docs/testing.md).

* :mod:`model.machine` — SPEC.md §2–5 transcribed over plain lists, plus troth's
  documented choices (docs/protocol.md) where the specification leaves room;
* :mod:`model.properties` — the 95 catalogue properties of SPEC.md §6;
* :mod:`model.mapping` — ``debug.snap`` into the model's shape, an in-process troth
  driver, and the step-by-step comparison the differential tests run.

Nothing here imports ``troth.machine``: the point of the model is to be a second,
separate reading of the specification.
"""
