"""Recipe: source-code trees (one file = one document)."""

from __future__ import annotations

from slimdata.ingest import BuildConfig

CODE_SUFFIXES = (
    "*.py",
    "*.pyi",
    "*.c",
    "*.h",
    "*.cc",
    "*.cpp",
    "*.hpp",
    "*.cu",
    "*.rs",
    "*.go",
    "*.java",
    "*.kt",
    "*.scala",
    "*.js",
    "*.ts",
    "*.tsx",
    "*.rb",
    "*.php",
    "*.cs",
    "*.swift",
    "*.m",
    "*.sh",
    "*.lua",
    "*.jl",
    "*.r",
    "*.R",
    "*.sql",
    "*.hs",
    "*.ml",
    "*.el",
    "*.pl",
    "*.S",
)
VENDORED = ("node_modules", "vendor", "third_party", "__pycache__", "*.min.js", "build", "dist")


def code() -> BuildConfig:
    """Code corpus: walk directories for source files, skip vendored and built trees.

    Files are single documents; generated giants (register headers, lookup tables) are kept
    whole and sliced, never truncated.
    """
    return BuildConfig(format="text", include=CODE_SUFFIXES, exclude=VENDORED, slice_tokens=2048)
