"""slimdata.hooks: the train-time runtime (loader, pack executor, attention backends,
DP-Merge, callbacks). Imports torch; the ``slimdata`` library never imports this package."""
