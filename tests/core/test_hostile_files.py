"""Untrusted files (lengths files, index.json) are validated before use, at bounded cost:
a clear `Error: ...` (exit 2), never a traceback or an allocation a file asks for (issue 18)."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from slimdata import mdsindex
from slimdata.cli import cli
from slimdata.docsource import load_lengths
from slimdata.errors import ConfigError, InputError
from slimdata.mdsindex import check_index, check_inside
from slimdata.slicing import MAX_DOCUMENT_TOKENS, check_length, slice_cuts
from slimdata.solver import Layout

LAYOUT = ["--nodes", "1", "--ranks-per-node", "2", "--global-batch-tokens", "4096"]
LAYOUT += ["--memory-gib", "40"]


def plan_cli(tmp_path, *args):
    return CliRunner().invoke(cli, ["plan", *args, *LAYOUT, "-o", str(tmp_path / "plan")])


def test_length_of_ten_to_the_fifteen_is_refused_before_allocation(tmp_path):
    path = tmp_path / "lengths.txt"
    path.write_text("100\n1000000000000000\n")
    result = plan_cli(tmp_path, "--lengths", str(path))
    assert result.exit_code == 2, result.output
    assert result.output == (
        f"Error: {path}:2: length 1000000000000000 exceeds the maximum of 2147483647 tokens "
        "per document (int32 attention offsets); split the document\n"
    )
    assert not (tmp_path / "plan").exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[1, 1e400]", "entry 2: length inf is not an integer"),
        ("[1, 2.5]", "entry 2: length 2.5 is not an integer"),
        ('[1, "3"]', "entry 2: length '3' is not an integer"),
        ("[1, true]", "entry 2: length True is not an integer"),
        ("[1, [2]]", "entry 2: length [2] is not an integer"),
        ("[5, 10000000000000000000000]", "entry 2: length 10000000000000000000000 exceeds"),
        ("[3, -4]", "entry 2: length -4 is negative"),
        ("[3, 0]", "entry 2: length is 0; lengths must be positive"),
        ('{"a": 1}', "1: '{\"a\": 1}' is not an integer length"),
        ("9" * 5000, "is not an integer length"),
        ("[" * 100_000, "invalid JSON list"),
        ("12\nx\n", "2: 'x' is not an integer length"),
        ("\n\n", "no lengths found"),
    ],
)
def test_bad_lengths_files_name_the_entry(tmp_path, content, message):
    path = tmp_path / "lengths.txt"
    path.write_text(content)
    with pytest.raises(InputError) as info:
        load_lengths(path)
    assert message in str(info.value) and str(path) in str(info.value)


def test_truncated_gzip_lengths_file_is_a_clear_error(tmp_path):
    path = tmp_path / "lengths.gz"
    path.write_bytes(gzip.compress(b"1\n2\n3\n" * 1000)[:40])
    with pytest.raises(InputError, match="cannot read lengths file"):
        load_lengths(path)


def test_largest_length_is_accepted_and_one_more_is_not():
    assert check_length(MAX_DOCUMENT_TOKENS) == MAX_DOCUMENT_TOKENS
    with pytest.raises(ConfigError, match="exceeds the maximum of 2147483647"):
        slice_cuts(MAX_DOCUMENT_TOKENS + 1, 128)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from slimdata.ingest import BuildConfig, build

    root = tmp_path_factory.mktemp("built")
    src = root / "docs.jsonl"
    src.write_text("".join(f'{{"text": "document number {i} " }}\n' for i in range(12)))
    tokenizer = str(Path(__file__).resolve().parents[1] / "fixtures" / "tiny_tokenizer.json")
    build(BuildConfig(inputs=(str(src),), tokenizer=tokenizer, slice_tokens=128), root / "ds")
    return root / "ds"


def hostile_copy(built, tmp_path, basename):
    """A copy of ``built`` whose first shard entry is renamed ``basename``; a valid copy of
    the shard waits at ``tmp_path/outside/shard.00000.mds`` (what a traversal would read)."""
    ds = tmp_path / "ds"
    shutil.copytree(built, ds)
    index = json.loads((ds / "index.json").read_text())
    real = ds / index["shards"][0]["raw_data"]["basename"]
    (tmp_path / "outside").mkdir()
    shutil.copy(real, tmp_path / "outside" / "shard.00000.mds")
    index["shards"][0]["raw_data"]["basename"] = basename
    (ds / "index.json").write_text(json.dumps(index))
    return ds


def test_index_basename_outside_the_dataset_is_refused_by_plan(built, tmp_path):
    ds = hostile_copy(built, tmp_path, "../outside/shard.00000.mds")
    result = plan_cli(tmp_path, str(ds))
    assert result.exit_code == 2, result.output
    assert result.output == (
        f"Error: {ds / 'index.json'}: shard 0: shard basename '../outside/shard.00000.mds' "
        "points outside the dataset directory; the index is corrupt or hostile, refusing to read it\n"
    )


def _without(entry: dict, key: str) -> dict:
    return {k: v for k, v in entry.items() if k != key}


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            lambda ix: ix.pop("version"),
            "index 'version' is None, not 2: not an index "
            "mosaicml-streaming reads (damaged, or of another version); rebuild the dataset",
        ),
        (
            lambda ix: ix["shards"][0].update(format="xyz"),
            "shard 0: version 2 and format 'xyz', not 2 and 'mds': slimdata reads MDS shards only",
        ),
        (
            lambda ix: ix["shards"][0].pop("version"),
            "shard 0: version None and format 'mds', not 2 and 'mds': slimdata reads MDS shards only",
        ),
        (
            lambda ix: ix["shards"].__setitem__(0, _without(ix["shards"][0], "column_encodings")),
            "shard 0: not an MDS shard entry (missing ['column_encodings'], unknown nothing): the "
            "index is damaged; rebuild the dataset",
        ),
        (
            lambda ix: ix["shards"][0].update(extra=1),
            "shard 0: not an MDS shard entry (missing nothing, unknown ['extra']): the index is "
            "damaged; rebuild the dataset",
        ),
        (
            lambda ix: ix["shards"][0]["column_names"].pop(),
            "shard 0: its column_names, column_encodings and column_sizes are not lists of one "
            "name, encoding and size (or null) per column: the index is damaged",
        ),
        (
            lambda ix: ix["shards"][0]["raw_data"].pop("hashes"),
            "shard 0: its 'raw_data' is not an object of basename, bytes and hashes",
        ),
        (
            lambda ix: ix["shards"][0].update(size_limit=-5),
            "shard 0: 'hashes' is not a list or 'size_limit' not a size: the index is damaged",
        ),
        (
            lambda ix: ix["shards"][0].update(compression=7),
            "shard 0: 'compression' is 7, not a name",
        ),
    ],
)
@pytest.mark.parametrize("command", ["plan", "stats", "simulate"])
def test_an_index_entry_streaming_cannot_read_is_a_clear_error(
    built, tmp_path, damage, message, command
):
    """JSON that parses but that streaming's reader cannot be built from: `plan` ended in a
    raw `KeyError: 'version'` or `TypeError` from `MDSReader(**entry)`; `stats` and
    `simulate` went on over an index no reader can open."""
    ds = tmp_path / "ds"
    shutil.copytree(built, ds)
    index = json.loads((ds / "index.json").read_text())
    damage(index)
    (ds / "index.json").write_text(json.dumps(index))
    args = {
        "plan": ["plan", str(ds), *LAYOUT, "-o", str(tmp_path / "plan")],
        "stats": ["stats", str(ds)],
        "simulate": [
            "simulate",
            str(ds),
            "--dp",
            "2",
            "--global-batch-tokens",
            "4096",
            "--memory-gib",
            "40",
            "--steps",
            "1",
        ],
    }[command]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert result.output == f"Error: {ds / 'index.json'}: {message}\n"
    assert not (tmp_path / "plan").exists()


def test_index_basename_through_a_symlink_is_refused(built, tmp_path):
    ds = hostile_copy(built, tmp_path, "link.mds")
    (ds / "link.mds").symlink_to(tmp_path / "outside" / "shard.00000.mds")
    with pytest.raises(InputError, match=r"'link\.mds' resolves outside the dataset directory"):
        check_index(ds)
    for name in ("/etc/passwd", "", "a\\..\\..\\b", 7):
        with pytest.raises(InputError, match="shard basename"):
            check_inside(ds, name, "x")


def test_loaders_refuse_a_dataset_whose_index_points_outside(built, tmp_path):
    from slimdata.hooks.loader import DocumentLoader, LoaderConfig, PlanShardLoader
    from streaming import LocalDataset

    ds = hostile_copy(built, tmp_path, "../outside/shard.00000.mds")
    dataset = LocalDataset(local=str(ds))  # streaming itself does not look
    cfg = LoaderConfig(layout=Layout(dp=2), global_batch_tokens=4096)
    with pytest.raises(InputError, match="points outside the dataset directory"):
        DocumentLoader(dataset, rank=0, config=cfg)
    with pytest.raises(InputError, match="points outside the dataset directory"):
        PlanShardLoader(dataset, rank=0, nodes=1, ranks_per_node=2)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{not json", "not a valid MDS index (Expecting property name"),
        (b"[" * 100_000, "not a valid MDS index (maximum recursion depth"),
        (b'{"shards": 3}', "not a valid MDS index (no 'shards' list)"),
        (b'{"shards": [3]}', "shard 0 is a int, not an object"),
        (b'{"shards": [{}]}', "shard 0 has no 'raw_data' entry"),
        (b'{"shards": [{"raw_data": {"basename": "a"}, "zip_data": 5}]}', "not an object"),
        (b"\xff\xfe", "not a valid MDS index ("),
    ],
)
def test_malformed_index_is_a_clear_error(tmp_path, content, message):
    (tmp_path / "index.json").write_bytes(content)
    with pytest.raises(InputError) as info:
        check_index(tmp_path)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("samples", "size", "message"),
    [
        (10**12, 4096, "shard 0 claims 1000000000000 samples in 4096 bytes"),
        (1023, 4096, "shard 0 claims 1023 samples in 4096 bytes"),
        (-1, 4096, "shard 0: 'samples' is -1, not a count of samples"),
        (True, 4096, "shard 0: 'samples' is True, not a count of samples"),
        (3, "4096", "shard 0: its raw data's 'bytes' is '4096', not a file size"),
    ],
)
def test_a_sample_count_its_shard_cannot_hold_is_refused(tmp_path, samples, size, message):
    """Streaming sizes arrays by ``samples`` without checking it (10^12 asked for 7.28 TiB);
    an MDS shard of ``b`` bytes holds at most ``b / 4 - 2`` samples (count, offsets)."""
    shard = {"raw_data": {"basename": "shard.00000.mds", "bytes": size}, "samples": samples}
    (tmp_path / "index.json").write_text(json.dumps({"shards": [shard]}))
    with pytest.raises(InputError, match=re.escape(message)):
        check_index(tmp_path)
    shard.update(samples=1022, raw_data={"basename": "shard.00000.mds", "bytes": 4096})
    (tmp_path / "index.json").write_text(json.dumps({"shards": [shard]}))
    assert check_index(tmp_path) == 1  # 4 * (1022 + 2) = 4096 bytes: the most that fit


@pytest.mark.parametrize("command", ["stats", "plan"])
def test_a_manifest_that_lost_rows_is_refused(built, tmp_path, command):
    """A manifest cut to fewer rows than index.json's samples would plan (or summarize) part
    of the corpus and exit 0; it is an error naming both counts."""
    ds = tmp_path / "ds"
    shutil.copytree(built, ds)
    pl.read_parquet(built / "manifest.parquet").head(5).write_parquet(ds / "manifest.parquet")
    args = [command, str(ds)] if command == "stats" else None
    result = CliRunner().invoke(cli, args) if args else plan_cli(tmp_path, str(ds))
    assert result.exit_code == 2, result.output
    assert result.output == (
        f"Error: {ds / 'manifest.parquet'}: 5 documents where index.json holds 12 samples: the "
        "manifest is damaged or from another build; rebuild with `slimdata build`\n"
    )


def test_stats_checks_the_manifest_as_plan_does(built, tmp_path):
    ds = tmp_path / "ds"
    shutil.copytree(built, ds)
    df = pl.read_parquet(built / "manifest.parquet").with_columns(length=pl.lit(-7))
    df.write_parquet(ds / "manifest.parquet")
    result = CliRunner().invoke(cli, ["stats", str(ds)])
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"Error: {ds / 'manifest.parquet'}: document length -7 ")


def test_oversized_index_is_refused_before_reading(tmp_path, monkeypatch):
    monkeypatch.setattr(mdsindex, "MAX_INDEX_BYTES", 100)
    (tmp_path / "index.json").write_bytes(b" " * 101)
    monkeypatch.setattr(Path, "read_bytes", lambda self: pytest.fail("read"))
    with pytest.raises(InputError, match="101 bytes is over the 100 byte limit for an index"):
        check_index(tmp_path)


def test_damaged_manifest_is_a_clear_error(built, tmp_path):

    ds = tmp_path / "ds"
    shutil.copytree(built, ds)
    (ds / "manifest.parquet").write_bytes(b"PAR1 not really")
    result = plan_cli(tmp_path, str(ds))
    assert result.exit_code == 2 and result.output.startswith(
        f"Error: {ds / 'manifest.parquet'}: unreadable or not a slimdata manifest ("
    )
    df = pl.read_parquet(built / "manifest.parquet").with_columns(length=pl.lit(10**15))
    df.write_parquet(ds / "manifest.parquet")
    result = plan_cli(tmp_path, str(ds))
    assert result.exit_code == 2, result.output
    assert result.output == (
        f"Error: {ds / 'manifest.parquet'}: document length 1000000000000000 exceeds the maximum "
        "of 2147483647 tokens per document (int32 attention offsets); split the document\n"
    )


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (("manifest.parquet", b"PAR1 not really"), "manifest.parquet: unreadable or not a slimdata manifest ("),
        (("slimdata.json", b'{"cost_model": {"a"'), "slimdata.json: unreadable or not a slimdata build sidecar ("),
        (("slimdata.json", b"[]"), "slimdata.json: not a slimdata build sidecar (expected a JSON object)"),
        (("slimdata.json", b'{"counts": 3}'), "slimdata.json: not a slimdata build sidecar (expected a JSON object)"),
        (("index.json", b'{"shards": [{"raw_da'), "index.json: not a valid MDS index ("),
    ],
)  # fmt: skip
def test_stats_of_a_damaged_build_is_a_clear_error(built, tmp_path, damage, message):
    ds = tmp_path / "ds"
    shutil.copytree(built, ds)
    assert CliRunner().invoke(cli, ["stats", str(ds)]).exit_code == 0  # the copy reads
    name, content = damage
    (ds / name).write_bytes(content)
    result = CliRunner().invoke(cli, ["stats", str(ds)])
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"Error: {ds / name.split()[0]}"), result.output
    assert message in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("command", ["stats", "simulate", "plan"])
def test_a_missing_build_directory_is_worded_alike_by_every_command(tmp_path, command):
    result = CliRunner().invoke(cli, [command, str(tmp_path / "nowhere")])
    assert result.exit_code == 2
    assert f"Directory '{tmp_path / 'nowhere'}' does not exist." in result.output


def test_stats_api_on_a_missing_directory_says_so(tmp_path):
    from slimdata.errors import InputError
    from slimdata.stats import shard_stats

    with pytest.raises(InputError, match=r"nowhere does not exist or is not a directory$"):
        shard_stats(tmp_path / "nowhere")


@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_plan_of_a_build_with_a_damaged_shard_is_a_clear_error_and_leaves_nothing(
    built, tmp_path, damage
):
    ds = tmp_path / "ds"
    shutil.copytree(built, ds)
    basename = json.loads((ds / "index.json").read_text())["shards"][0]["raw_data"]["basename"]
    shard = ds / basename
    assert plan_cli(tmp_path, str(ds)).exit_code == 0  # the copy plans
    shutil.rmtree(tmp_path / "plan")
    if damage == "missing":
        shard.unlink()
        expected = f"Error: {ds}: shard file {basename} is missing\n"
    else:
        size = shard.stat().st_size
        shard.write_bytes(shard.read_bytes()[: size // 2])
        expected = (
            f"Error: {shard}: {size // 2} bytes where index.json gives {size}: the shard is "
            "truncated or replaced; rebuild it\n"
        )
    result = plan_cli(tmp_path, str(ds))
    assert (result.exit_code, result.output) == (2, expected)
    assert not (tmp_path / "plan").exists()  # no half-written plan left behind


def test_no_room_for_model_states_names_only_what_would_help():
    from slimdata.cost.states import activation_budget_gib

    def message(parallelism, pp_option):
        with pytest.raises(ConfigError) as exc:  # 70B parameters on one 80 GiB device
            activation_budget_gib(80, 70 * 10**9, parallelism, "adam", 1, 1, pp_option=pp_option)
        return str(exc.value).split(": ", 1)[1]

    assert (
        message("ddp", True)
        == "use --parallelism zero1 or fsdp, a larger --pp, or give --memory-gib"
    )
    assert message("zero1", False) == "use --parallelism fsdp, or give --memory-gib"
    assert message("fsdp", False) == "give --memory-gib"


def test_a_plots_folder_the_disk_refuses_is_a_clear_error(built, tmp_path, monkeypatch):
    from slimdata.plots import write_plots

    def refuse(*_args, **_kwargs):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(Path, "mkdir", refuse)
    with pytest.raises(
        InputError, match=r"plots: cannot make the plots folder \(Read-only file system\)$"
    ):
        write_plots(built, tmp_path / "plots")
