"""The remote-call engine: attach, stop, judge a safe point, build and run one call, read and write the target's memory."""
