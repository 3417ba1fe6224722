"""The one exception type a user sees without a traceback.

A `JobError` means the job cannot run as configured: its message names what was wrong, where
(file, row, config key) and how to fix it. The CLI prints it and exits with status 2. Anything
else that escapes is a bug and keeps its traceback.
"""


class JobError(Exception):
    """A problem with the job's configuration, input or output location, found before or during work."""
