"""One exception type for every bad input; the CLI prints it as one line and exits 2."""


class SpecdecError(Exception):
    """A user-facing error: bad config, unknown pair/profile/study, missing model or raw data."""
