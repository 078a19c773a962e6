"""What every test run needs, whichever folder it collects."""

import signal


def pytest_configure(config):
    """Let the commands the tests start take Ctrl-C. A run started in the background of a script
    (``scripts/test.sh &``, ``nohup``) ignores SIGINT, every process it starts inherits that, and
    Python then installs no handler: the tests that stop a command with SIGINT would wait on it."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
