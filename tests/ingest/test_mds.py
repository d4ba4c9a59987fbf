"""The light import of streaming's writer (slimdata.ingest.mds) against the public import."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from build_helpers import make_text_corpus, read_shards, tiny_config, tree_bytes

from slimdata.ingest import build


def _python(code: str) -> dict:
    """Run ``code`` in a fresh interpreter (no streaming imported yet); its last JSON line."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_light_build_bytes_equal_public_import_build(tmp_path):
    import streaming  # this process: the public import path

    corpus = make_text_corpus(tmp_path)
    config = tiny_config(corpus, task_bytes=600, compression="zstd", hashes=("sha1",))
    build(config, tmp_path / "public")
    light = _python(
        f"""
        import json, sys
        from slimdata.ingest import BuildConfig, build
        config = BuildConfig(**{config.__dict__!r})
        build(config, {str(tmp_path / "light")!r})
        modules = {{m: type(sys.modules[m]).__name__ for m in sys.modules if m.startswith("streaming")}}
        print(json.dumps({{"transformers": "transformers" in sys.modules, "modules": modules}}))
        """
    )
    assert light["modules"]["streaming"] == "_DeferredPackage"  # the light path did run
    assert "streaming.base.dataset" not in light["modules"] and not light["transformers"]
    public, written = tree_bytes(tmp_path / "public"), tree_bytes(tmp_path / "light")
    assert len(public) > 20 and public == written
    assert streaming.MDSWriter.__module__ == "streaming.base.format.mds.writer"


def test_package_is_whole_after_the_light_import(tmp_path):
    corpus = make_text_corpus(tmp_path, files=3)
    out = build(tiny_config(corpus), tmp_path / "out").output
    result = _python(
        f"""
        import json
        from slimdata.ingest.mds import writer_class, merge_index
        writer = writer_class()
        import streaming
        from streaming import MDSWriter, StreamingDataset
        import streaming.base.format as fmt
        ds = StreamingDataset(local={str(out)!r}, shuffle=False, batch_size=1)
        print(json.dumps({{
            "same_class": MDSWriter is writer is fmt.MDSWriter,
            "kinds": sorted({{type(m).__name__ for n, m in __import__("sys").modules.items()
                             if n.startswith("streaming")}}),
            "version": streaming.__version__,
            "samples": ds.num_samples,
            "json_writer": fmt.JSONWriter.__name__,
        }}))
        """
    )
    assert result == {
        "same_class": True,
        "kinds": ["module"],  # every deferred parent ran its __init__
        "version": "0.13.0",
        "samples": 3,
        "json_writer": "JSONWriter",
    }
    samples, _ = read_shards(out)
    assert len(samples) == 3


def test_public_import_when_streaming_is_already_imported():
    result = _python(
        """
        import json, streaming
        from slimdata.ingest.mds import writer_class
        print(json.dumps({"public": writer_class() is streaming.MDSWriter}))
        """
    )
    assert result == {"public": True}
