"""jemalloc: ``home`` (what detection and the commands ask of it), ``reader``
(plan, gather, parse and normalise a live process's numbers) and their
helpers.  Empty on purpose: detection imports every allocator's ``home``,
and a package body would import every reader with it (issue 23).
"""
