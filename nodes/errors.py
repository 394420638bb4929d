"""Errors raised by nodes that end a run with a named reason."""


class StepLimitError(RuntimeError):
    """The run made `max_steps` model calls without reaching an answer."""

    reason = "step_limit"
