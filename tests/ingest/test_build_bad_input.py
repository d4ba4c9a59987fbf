"""Every kind of bad input gets a clear message, and nothing is lost silently."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from build_helpers import TINY_TOKENIZER, read_shards, tiny_config
from click.testing import CliRunner
from tokenizers import Tokenizer

from slimdata.cli import cli
from slimdata.errors import ConfigError, InputError, OutputExistsError, TokenizerError
from slimdata.ingest import build
from slimdata.tokenize import load_tokenizer


def quarantine(out):
    return [json.loads(line) for line in (out / "quarantine.jsonl").read_text().splitlines()]


def test_bad_records_are_quarantined_with_reasons(tmp_path):
    src = tmp_path / "mixed.jsonl"
    lines = [
        b'{"text": "good one"}',
        b'{"text": "broken',
        b'{"title": "no text field"}',
        b'{"text": 42}',
        b'{"text": "bad \xff\xfe bytes"}',
        b'{"text": ""}',
        b"",
        b'["not", "an", "object"]',
        b'{"text": "good two"}',
    ]
    src.write_bytes(b"\n".join(lines) + b"\n")
    (tmp_path / "txt").mkdir()
    (tmp_path / "txt" / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (tmp_path / "txt" / "empty.txt").write_text("")
    (tmp_path / "txt" / "ok.txt").write_text("fine text")
    out = tmp_path / "out"
    summary = build(tiny_config(src, tmp_path / "txt"), out)
    reasons = {q["doc_id"]: q["reason"] for q in quarantine(out)}
    assert reasons["mixed/mixed.jsonl:2"].startswith("malformed JSON")
    assert reasons["mixed/mixed.jsonl:3"].startswith("missing text field 'text' (fields: title)")
    assert reasons["mixed/mixed.jsonl:4"] == "text field 'text' is int, not a string"
    assert reasons["mixed/mixed.jsonl:5"].startswith("undecodable bytes (not UTF-8)")
    assert reasons["mixed/mixed.jsonl:6"] == "empty document (no text)"
    assert reasons["mixed/mixed.jsonl:8"] == "record is a JSON list, not an object"
    assert reasons["txt/latin1.txt"] == "undecodable bytes (not UTF-8) at byte 3"
    assert reasons["txt/empty.txt"] == "empty document (no text)"
    assert len(reasons) == 8  # the blank line 7 is not a record
    samples, _ = read_shards(out)
    assert [s["doc_id"] for s in samples] == [
        "mixed/mixed.jsonl:1",
        "mixed/mixed.jsonl:9",
        "txt/ok.txt",
    ]
    assert summary.counts["quarantined"] == 8 and summary.counts["documents"] == 3
    side = json.loads((out / "slimdata.json").read_text())
    assert side["counts"]["quarantined"] == 8


def test_giant_document_is_sliced_not_dropped(tmp_path):
    rng = np.random.default_rng(0)
    words = ["".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), 3)) for _ in range(500)]
    text = " ".join(rng.choice(words, 1_300_000))
    (tmp_path / "giant.txt").write_text(text)
    out = tmp_path / "out"
    build(tiny_config(tmp_path / "giant.txt", size_limit="1mb"), out)
    want = [*Tokenizer.from_file(TINY_TOKENIZER).encode(text, add_special_tokens=False).ids, 0]
    assert len(want) > 4_000_000  # millions of tokens
    samples, _ = read_shards(out)
    (doc,) = samples
    assert doc["length"] == len(want) and np.array_equal(
        doc["tokens"], np.asarray(want, dtype=np.uint32)
    )
    assert len(doc["slices"]) - 1 == -(-len(want) // 128)


def test_truncate_is_opt_in_and_counted(tmp_path):
    (tmp_path / "a.txt").write_text("word " * 500)
    out = tmp_path / "out"
    summary = build(tiny_config(tmp_path / "a.txt", truncate=100), out)
    (doc,) = read_shards(out)[0]
    full = Tokenizer.from_file(TINY_TOKENIZER).encode("word " * 500, add_special_tokens=False).ids
    assert doc["tokens"].tolist() == [*full[:99], 0]
    assert (
        summary.counts["dropped_tokens"] == len(full) + 1 - 100
        and summary.counts["truncated_documents"] == 1
    )


def test_all_rejected_is_an_error_naming_the_quarantine(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"x": 1}\n{"y": 2}\n')
    with pytest.raises(InputError, match=r"all 2 records were rejected.*quarantine.jsonl"):
        build(tiny_config(tmp_path / "bad.jsonl"), tmp_path / "out")


def test_a_build_that_wrote_no_document_leaves_only_its_quarantine(tmp_path):
    src = tmp_path / "bad.jsonl"
    src.write_text('{"x": 1}\n{"y": 2}\n')
    out = tmp_path / "out"
    args = ["build", str(src), "-o", str(out), "--tokenizer", TINY_TOKENIZER, "--quiet"]
    error = (
        f"Error: no document was written: all 2 records were rejected; "
        f"see {out / 'quarantine.jsonl'} for the reasons\n"
    )
    for _ in range(2):  # the same command again: the quarantine file alone is no build to refuse
        result = CliRunner().invoke(cli, args)
        assert (result.exit_code, result.output) == (2, error)
        assert sorted(p.name for p in out.iterdir()) == ["quarantine.jsonl"]
        assert [q["doc_id"] for q in quarantine(out)] == ["bad/bad.jsonl:1", "bad/bad.jsonl:2"]
    src.write_text('{"text": "fixed"}\n')
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert quarantine(out) == [] and (out / "index.json").is_file()


def test_counts_of_one_are_singular(tmp_path):
    """One document, slice, task, quarantined record and dropped token: each named in the
    singular."""
    src = tmp_path / "one.jsonl"
    src.write_text('{"text": "return x"}\n{"x": 1}\n')  # 3 tokens + EOS, truncated to 3
    out = tmp_path / "out"
    args = ["build", str(src), "-o", str(out), "--tokenizer", TINY_TOKENIZER]
    result = CliRunner().invoke(cli, [*args, "--truncate", "3"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(
        f"wrote 1 document, 3 tokens, 1 slice to {out} (1 task run, 0 resumed, "
    )
    assert result.stderr.splitlines()[-2:] == [  # below the progress bar
        f"quarantined 1 record: see {out}/quarantine.jsonl",
        "--truncate dropped 1 token from 1 document",
    ]
    src.write_text('{"x": 1}\n')
    result = CliRunner().invoke(cli, [*args, "--quiet", "--overwrite"])
    assert (result.exit_code, result.output) == (
        2,
        "Error: no document was written: the only record was rejected; "
        f"see {out / 'quarantine.jsonl'} for the reasons\n",
    )


def test_inputs_without_a_record_leave_an_empty_output(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n")
    out = tmp_path / "out"
    with pytest.raises(InputError, match=r"^no document was written: the inputs hold no record$"):
        build(tiny_config(tmp_path / "empty.jsonl"), out)
    assert list(out.iterdir()) == []
    (tmp_path / "empty.jsonl").write_text('{"text": "one"}\n')
    assert build(tiny_config(tmp_path / "empty.jsonl"), out).counts["documents"] == 1


def test_corrupt_gzip_is_quarantined(tmp_path):
    data = gzip.compress(b'{"text": "one"}\n{"text": "two"}\n' * 200)
    (tmp_path / "cut.jsonl.gz").write_bytes(data[: len(data) // 2])
    (tmp_path / "ok.jsonl").write_text('{"text": "fine"}\n')
    out = tmp_path / "out"
    build(tiny_config(tmp_path / "cut.jsonl.gz", tmp_path / "ok.jsonl"), out)
    (entry,) = quarantine(out)
    assert entry["reason"].startswith("unreadable, corrupt or truncated file")


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        (["missing.jsonl"], "input 'missing.jsonl' does not exist"),
        (["nothing/*.jsonl"], "matches no file"),
    ],
)
def test_missing_inputs(tmp_path, monkeypatch, inputs, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match=message):
        build(tiny_config(*inputs), tmp_path / "out")


def test_unknown_tokenizer_and_offline_tiktoken(tmp_path, monkeypatch):
    with pytest.raises(TokenizerError, match="unknown tokenizer 'no-such-tokenizer'"):
        load_tokenizer("no-such-tokenizer")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    with pytest.raises(TokenizerError, match=r"not in the offline cache.*never downloads"):
        load_tokenizer("cl100k_base")
    (tmp_path / "junk.json").write_text("{not a tokenizer")
    with pytest.raises(TokenizerError, match="cannot load tokenizer file"):
        load_tokenizer(tmp_path / "junk.json")


def test_a_directory_without_a_tokenizer_is_named_in_one_short_line(tmp_path):
    # --tokenizer pointed at a corpus folder (or an empty one) by mistake
    (tmp_path / "empty").mkdir()
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("text")
    for d in ("empty", "corpus"):
        with pytest.raises(TokenizerError) as info:
            load_tokenizer(tmp_path / d)
        assert str(info.value) == (
            f"cannot load a tokenizer from directory {tmp_path / d}: it holds no tokenizer.json, "
            "tokenizer_config.json or config.json (a Hugging Face tokenizer directory has them)"
        )


@pytest.mark.parametrize(
    ("files", "found"),
    [
        (["config.json"], "config.json"),  # a model's config.json alone
        (["model.safetensors", "config.json"], "config.json, model.safetensors"),
        (
            ["tokenizer_config.json", "special_tokens_map.json"],
            "special_tokens_map.json, tokenizer_config.json",
        ),
        (
            [f"shard-{i}.bin" for i in range(10)] + ["config.json"],
            "config.json, "
            "shard-0.bin, shard-1.bin, shard-2.bin, shard-3.bin, shard-4.bin, shard-5.bin, "
            "shard-6.bin and 3 more",
        ),
    ],
)
def test_a_directory_with_config_but_no_vocabulary_says_what_a_tokenizer_needs(
    tmp_path, files, found
):
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / ".hidden").write_text("")
    (tok / "sub").mkdir()
    for name in files:
        (tok / name).write_text('{"model_type": "llama"}' if name == "config.json" else "{}")
    message = (
        f"cannot load a tokenizer from directory {tok}: it holds {found} but no tokenizer "
        "file; a tokenizer directory needs tokenizer.json, or a slow tokenizer's vocabulary "
        "for transformers to convert (tokenizer.model, spiece.model, sentencepiece.bpe.model, "
        "spm.model, sentencepiece.model, vocab.json with merges.txt, or vocab.txt)"
    )
    with pytest.raises(TokenizerError) as info:
        load_tokenizer(tok)
    assert str(info.value) == message
    (tmp_path / "a.txt").write_text("text")
    args = ["build", str(tmp_path / "a.txt"), "-o", str(tmp_path / "out"), "--tokenizer"]
    result = CliRunner().invoke(cli, [*args, str(tok)])
    assert (result.exit_code, result.output) == (2, f"Error: {message}\n")


def test_a_directory_with_a_slow_tokenizers_vocabulary_still_loads(tmp_path):
    """The check above refuses no directory that transformers converts: vocab.json and
    merges.txt of the tiny tokenizer give its tokens."""
    tiny = Tokenizer.from_file(TINY_TOKENIZER)
    tiny.model.save(str(tmp_path))
    (tmp_path / "tokenizer_config.json").write_text(
        '{"tokenizer_class": "GPT2Tokenizer", "eos_token": "<|endoftext|>"}'
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "merges.txt",
        "tokenizer_config.json",
        "vocab.json",
    ]
    tok = load_tokenizer(tmp_path)
    assert (tok.vocab_size, tok.eos_id) == (512, 0)
    text = "def f(): return 1"
    assert tok.encode_batch([text])[0].tolist() == tiny.encode(text).ids


def test_existing_output_is_refused_unless_asked(tmp_path):
    (tmp_path / "a.txt").write_text("hello")
    out = tmp_path / "out"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    with pytest.raises(OutputExistsError, match="--overwrite"):
        build(tiny_config(tmp_path / "a.txt"), out)
    with pytest.raises(OutputExistsError, match="does not look like a slimdata build"):
        build(tiny_config(tmp_path / "a.txt"), out, overwrite=True)
    assert (out / "precious.txt").exists()
    other = tmp_path / "built"
    build(tiny_config(tmp_path / "a.txt"), other)
    build(tiny_config(tmp_path / "a.txt"), other, overwrite=True)
    assert (other / "slimdata.json").exists()


def test_a_build_killed_while_it_wrote_its_build_plan_is_replaced_by_overwrite(tmp_path):
    """Killed inside ``write_atomic`` of ``build_plan.json``, a build leaves only its
    ``.tmp``: ``--overwrite`` replaces that, ``--resume`` says to use ``--overwrite``."""
    (tmp_path / "a.txt").write_text("hello")
    out = tmp_path / "out"
    out.mkdir()
    (out / "build_plan.json.tmp").write_text('{"slimdata_build_pl')
    with pytest.raises(ConfigError) as info:
        build(tiny_config(tmp_path / "a.txt"), out, resume=True)
    assert str(info.value) == (
        f"cannot resume {out}: its build_plan.json is unreadable ([Errno 2] No such file or "
        f"directory: '{out / 'build_plan.json'}'); use --overwrite to start over"
    )
    build(tiny_config(tmp_path / "a.txt"), out, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == [
        "build_plan.json",
        "index.json",
        "manifest.parquet",
        "quarantine.jsonl",
        "slimdata.json",
        "task-00000",
    ]


def test_overwrite_needs_a_slimdata_build_not_any_index_json(tmp_path):
    """An ``index.json`` alone (any MDS dataset, plan shards) does not make a directory a
    slimdata build: ``--overwrite`` refuses it and deletes nothing."""
    (tmp_path / "a.txt").write_text("hello")
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "index.json").write_text('{"version":2,"shards":[]}')
    (victim / "my_thesis.tex").write_text("precious")
    plan = tmp_path / "plan"
    (tmp_path / "lengths.txt").write_text("300\n40\n900\n")
    layout = ["--nodes", "1", "--ranks-per-node", "2", "--global-batch-tokens", "4096"]
    layout += ["--memory-gib", "8", "--context", "1024"]
    made = CliRunner().invoke(
        cli, ["plan", "--lengths", str(tmp_path / "lengths.txt"), *layout, "-o", str(plan)]
    )
    assert made.exit_code == 0, made.output
    plan_files = sorted(p.name for p in plan.iterdir())
    assert "plan.json" in plan_files and "index.json" in plan_files
    for out, kept in ((victim, ["index.json", "my_thesis.tex"]), (plan, plan_files)):
        args = ["build", str(tmp_path / "a.txt"), "-o", str(out), "--tokenizer", TINY_TOKENIZER]
        result = CliRunner().invoke(cli, [*args, "--overwrite"])
        assert result.exit_code == 2, result.output
        assert result.output == (
            f"Error: refusing to --overwrite {out}: it does not look like a slimdata build "
            "(no build_plan.json or slimdata.json); remove it yourself if you mean it\n"
        )
        assert sorted(p.name for p in out.iterdir()) == kept
    assert (victim / "my_thesis.tex").read_text() == "precious"


def test_an_output_below_a_file_is_refused_before_any_work(tmp_path):
    (tmp_path / "a.txt").write_text("hello")
    (tmp_path / "README.md").write_text("a file")
    below = str(tmp_path / "README.md" / "x")
    args = ["build", str(tmp_path / "a.txt"), "--tokenizer", TINY_TOKENIZER]
    for name, options in (
        ("'-o' / '--output'", ["-o", below]),
        ("'--plan'", ["-o", str(tmp_path / "out"), "--plan", below]),
    ):
        result = CliRunner().invoke(cli, [*args, *options])
        assert result.exit_code == 2, result.output
        assert result.output.splitlines()[-1] == (
            f"Error: Invalid value for {name}: {below}: {tmp_path / 'README.md'} is a file, not a folder"
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md", "a.txt"]


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_an_output_that_cannot_be_created_is_a_message(tmp_path):
    """``/proc`` takes no new directory, even from root (for whom it looks writable)."""
    (tmp_path / "a.txt").write_text("hello")
    with pytest.raises(ConfigError) as refused:
        build(tiny_config(tmp_path / "a.txt"), "/proc/slimdata-test")
    assert str(refused.value).startswith("cannot create the output directory /proc/slimdata-test (")
    assert str(refused.value).endswith("); choose another --output")
    args = ["build", str(tmp_path / "a.txt"), "-o", "/proc/slimdata-test"]
    result = CliRunner().invoke(cli, [*args, "--tokenizer", TINY_TOKENIZER])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit)
    assert result.output.splitlines()[-1].startswith("Error: ")
    assert "/proc/slimdata-test" in result.output.splitlines()[-1]


def test_cli_errors_are_messages_not_tracebacks(tmp_path):
    runner = CliRunner()
    cases = [
        [
            "build",
            str(tmp_path / "missing"),
            "-o",
            str(tmp_path / "o1"),
            "--tokenizer",
            TINY_TOKENIZER,
        ],
        ["build", str(tmp_path), "-o", str(tmp_path / "o2"), "--tokenizer", "nope"],
        [
            "build",
            str(tmp_path),
            "-o",
            str(tmp_path / "o3"),
            "--tokenizer",
            TINY_TOKENIZER,
            "--slice-tokens",
            "100",
        ],
        [
            "build",
            str(tmp_path),
            "-o",
            str(tmp_path / "o4"),
            "--tokenizer",
            TINY_TOKENIZER,
            "--compression",
            "lz9",
        ],
        ["build", str(tmp_path), "-o", str(tmp_path / "o5"), "--pipeline", "nope"],
    ]  # a missing directory is a usage error, as for plan and simulate (test_hostile_files)
    for args in cases:
        result = runner.invoke(cli, args)
        assert result.exit_code != 0, args
        assert isinstance(result.exception, SystemExit), (args, result.exception)
        assert result.output.startswith("Error: "), (args, result.output)


def test_binary_text_inputs_are_quarantined_not_tokenized(tmp_path):
    # valid UTF-8 but binary (zero-filled, ASCII with NULs), and an ELF-like header
    src = tmp_path / "txt"
    src.mkdir()
    (src / "zeros.txt").write_bytes(b"\0" * 4096)
    (src / "nul.txt").write_bytes(b"hello\0\1\2world" * 50)
    (src / "elf.bin").write_bytes(b"\x7fELF\2\1\1\0" + b"\0" * 56)
    (src / "ok.txt").write_text("plain text\n")
    out = tmp_path / "out"
    summary = build(tiny_config(src), out)
    reasons = {q["doc_id"]: q["reason"] for q in quarantine(out)}
    assert reasons == {
        "txt/zeros.txt": "binary file (NUL byte at byte 0), not text",
        "txt/nul.txt": "binary file (NUL byte at byte 5), not text",
        "txt/elf.bin": "binary file (NUL byte at byte 7), not text",
    }
    samples, _ = read_shards(out)
    assert [s["doc_id"] for s in samples] == ["txt/ok.txt"]
    assert summary.counts["quarantined"] == 3 and summary.counts["documents"] == 1


def test_dangling_link_is_quarantined_not_a_crash(tmp_path):
    src = tmp_path / "txt"
    src.mkdir()
    (src / "ok.txt").write_text("plain text\n")
    (src / "gone.js").symlink_to(tmp_path / "missing.js")
    out = tmp_path / "out"
    summary = build(tiny_config(src), out)
    reasons = {q["doc_id"]: q["reason"] for q in quarantine(out)}
    assert reasons == {"txt/gone.js": "cannot read file: No such file or directory"}
    assert summary.counts["documents"] == 1


def test_an_output_inside_an_input_directory_is_refused_unless_excluded(tmp_path):
    """A rerun would read the build's own files as input: refused before anything is
    written, with the --exclude that prunes it; with that --exclude the build and its
    --overwrite rerun see only the corpus."""
    from slimdata.errors import ConfigError
    from slimdata.ingest import build

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("hello world " * 50)
    out = corpus / "shards" / "v1"
    with pytest.raises(ConfigError) as err:
        build(tiny_config(corpus), out)
    assert str(err.value) == (
        f"--output {out} is inside the input directory {corpus}: the build would read its own "
        "files on a rerun; choose an output outside the inputs, or add --exclude 'shards/v1'"
    )
    assert not out.exists()
    with pytest.raises(ConfigError, match=r"choose an output outside the inputs$"):
        build(tiny_config(corpus), corpus)
    first = build(tiny_config(corpus, exclude=("shards",)), out)
    again = build(tiny_config(corpus, exclude=("shards",)), out, overwrite=True)
    assert first.counts["documents"] == again.counts["documents"] == 1


def test_compressed_text_files_are_read_decompressed(tmp_path, monkeypatch):
    # a Debian package's docs: changelog.Debian.gz and a man page .gz are text once
    # decompressed; a .tar.gz is binary once decompressed, a truncated .gz is damaged and a
    # .gz that expands past the limit is no document: each quarantined with its reason
    import gzip

    import zstandard

    from slimdata.readers import text as text_reader

    src = tmp_path / "doc"
    src.mkdir()
    (src / "changelog.Debian.gz").write_bytes(gzip.compress(b"pkg (1.0-1) unstable\n"))
    (src / "tool.1.zst").write_bytes(zstandard.compress(b".TH TOOL 1\nA tool.\n"))
    (src / "plain.txt").write_text("plain text\n")
    (src / "src.tar.gz").write_bytes(gzip.compress(b"file.c\0\0\0" + b"\0" * 500))
    (src / "cut.txt.gz").write_bytes(gzip.compress(b"some text " * 100)[:30])
    (src / "big.txt.gz").write_bytes(gzip.compress(b"a" * 2000))
    monkeypatch.setattr(text_reader, "MAX_DECOMPRESSED_BYTES", 1000)
    out = tmp_path / "out"
    summary = build(tiny_config(src), out)
    reasons = {q["doc_id"]: q["reason"] for q in quarantine(out)}
    assert reasons == {
        "doc/src.tar.gz": "binary file (NUL byte at byte 6), not text",
        "doc/cut.txt.gz": "cannot decompress .gz file: Compressed file ended before the "
        "end-of-stream marker was reached",
        "doc/big.txt.gz": "decompresses to more than 1,000 bytes, not a document",
    }
    samples, _ = read_shards(out)
    assert sorted(s["doc_id"] for s in samples) == [
        "doc/changelog.Debian.gz",
        "doc/plain.txt",
        "doc/tool.1.zst",
    ]
    assert summary.counts["documents"] == 3


def test_a_resumed_build_reports_no_throughput(tmp_path):
    # a whole build reports tokens/s; --resume of a finished one tokenizes nothing, so a rate
    # of all its tokens over the resume's seconds would be no throughput at all
    src = tmp_path / "one.jsonl"
    src.write_text('{"text": "return x"}\n')
    out = tmp_path / "out"
    args = ["build", str(src), "-o", str(out), "--tokenizer", TINY_TOKENIZER]
    whole = CliRunner().invoke(cli, args)
    assert whole.exit_code == 0 and whole.stdout.rstrip().endswith(" tokens/s)")
    resumed = CliRunner().invoke(cli, [*args, "--resume"])
    assert resumed.exit_code == 0, resumed.output
    line = resumed.stdout.strip()
    assert line.startswith(f"wrote 1 document, 4 tokens, 1 slice to {out} (0 tasks run, 1 resumed")
    assert line.endswith("s)") and "tokens/s" not in line
