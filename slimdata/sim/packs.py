"""Pack pricing lives in :mod:`slimdata.execution.pricing`; this name stays importable."""

from slimdata.execution.pricing import PackTimes, chunk_fractions, pack_times, padding_call_times

__all__ = ["PackTimes", "chunk_fractions", "pack_times", "padding_call_times"]
