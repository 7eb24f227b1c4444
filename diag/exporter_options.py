"""The exporter's option values the command line offers (``--group-by``
choices, the ``--max-targets`` default), apart from ``diag.exporter`` so
that building the parser does not import prometheus_client and the host
scanner: every command's start-up pays for the parser."""

GROUP_BY = ("comm", "exe", "user")
# The pid label of allocdiag_target_info makes one series per target: cap them.
MAX_TARGETS_DEFAULT = 16
