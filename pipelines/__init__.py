"""Ready build recipes (no logic): each a function returning a build config."""
