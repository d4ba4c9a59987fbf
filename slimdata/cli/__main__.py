"""``python -m slimdata.cli``: the ``slimdata`` command without its console script."""

from slimdata.cli import main

main()
