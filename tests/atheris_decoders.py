"""Coverage-guided fuzzing of the decoders with atheris (libFuzzer), beyond hypothesis.

    python -m tests.atheris_decoders TARGET [libFuzzer flags, e.g. -max_total_time=60]

`make fuzz-atheris` installs atheris (the optional `fuzz` extra: it ships binary wheels
for CPython on Linux x86-64 only, so it is not a development dependency) and runs every
target for FUZZ_SECONDS each. The oracles are those of tests/unit/test_fuzz_decoders.py;
libFuzzer starts from valid encodings and saves an input that breaks an oracle as
crash-<sha1> in the current directory (reproduce it with the same command and the file).
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import atheris

with atheris.instrument_imports(include=["sdk", "mockbroker"]):
    from sdk._wire import encode_properties
    from tests.unit.test_fuzz_decoders import (
        FRAMES,
        LOCKS,
        OFFSETS,
        RECORDS,
        SCHEDULED,
        TOPICS,
        check_frames_oracle,
        load_locks,
        load_offsets,
        load_topics,
        properties_oracle,
        records_oracle,
    )

SCRATCH = Path(tempfile.mkdtemp(prefix="ordermq-atheris-"))


def from_file(load: Callable[[Path], None], name: str) -> Callable[[bytes], None]:
    """The oracle `load` of the file `name`, fed the fuzzer's bytes as its content."""

    def oracle(data: bytes) -> None:
        path = SCRATCH / name
        path.write_bytes(data)
        load(path)

    return oracle


#: Target name -> (oracle, seeds).
TARGETS: dict[str, tuple[Callable[[bytes], None], list[bytes]]] = {
    "frames": (check_frames_oracle, [FRAMES, SCHEDULED]),
    "records": (records_oracle, [RECORDS]),
    "properties": (properties_oracle, [encode_properties({"k": "v", "ключ": ""})]),
    "locks.json": (from_file(load_locks, "locks.json"), [json.dumps(LOCKS).encode()]),
    "offsets.json": (from_file(load_offsets, "offsets.json"), [json.dumps(OFFSETS).encode()]),
    "topics.json": (from_file(load_topics, "topics.json"), [json.dumps(TOPICS).encode()]),
}


def main() -> None:
    """Fuzz the target named by the first argument; the rest go to libFuzzer."""
    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        raise SystemExit(f"usage: python -m tests.atheris_decoders {{{','.join(TARGETS)}}} ...")
    oracle, seeds = TARGETS[sys.argv[1]]
    corpus = SCRATCH / "corpus"
    corpus.mkdir()
    for i, seed in enumerate(seeds):
        (corpus / f"seed-{i}").write_bytes(seed)
    atheris.Setup([sys.argv[0], *sys.argv[2:], str(corpus)], oracle)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
