"""Runnable workloads that reproduce the field's classic allocator situations.

Each workload is a small, standalone program (Python or C) that prints
``READY <details>`` on stdout once it is in the state worth inspecting with
allocdiag, then keeps running until it is killed.  ``examples.launch`` runs
any of them under any installed allocator and lists them in ``WORKLOADS``.

    python3 examples/launch.py lying_rss --allocator jemalloc
    python3 -c 'from examples.launch import WORKLOADS; print(list(WORKLOADS))'
"""
