"""Fuzz the event decoder: ``python -m ops.fuzz --inputs 1000000``.

Feeds :meth:`schemas.Codec.decode` random bytes and mutated valid events (Avro
single-object and JSON: bit flips, byte changes, truncations, insertions,
deletions, splices of two events, swapped schema fingerprints, chunk repeats) and
checks the codec's contract on each input: it returns a valid event or raises
:class:`~schemas.BadEvent` with a reason and the untouched bytes, never anything
else; whatever decodes re-encodes (Avro and JSON) to an equal event. Prints how
many inputs were tried, decoded, refused (by kind of reason) and broke the contract.

``--engine atheris`` runs the same check under atheris (coverage-guided libFuzzer)
with the valid events as seed corpus, when atheris is installed.
"""

from __future__ import annotations

import argparse
import importlib
import random
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID, uuid5

from processors import AgentMemory, MemoryConfig
from schemas import BadEvent, Codec, Event
from schemas.avro import MAGIC
from schemas.codec import TYPES_BY_NAME

NAMESPACE = UUID("5c1e0f3a-9b7d-4c2e-8f60-7a1b2c3d4e5f")
T0 = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)


def raw_events(agent_id: str = "fuzz-agent") -> list[Event]:
    """One event of every raw type, in English and Chinese, as an agent would write."""
    bodies: list[tuple[str, dict[str, Any]]] = [
        ("session.started", {"task": "plan a trip 规划旅行"}),
        (
            "interaction.recorded",
            {
                "role": "user",
                "content": "I love green tea 我喜欢绿茶",
                "intent": "preference",
                "entities": ["green tea", "绿茶"],
                "importance": 9.5,
                "sentiment": 0.9,
                "confidence": 0.8,
            },
        ),
        ("interaction.recorded", {"role": "assistant", "content": "好的，记住了 noted"}),
        ("tool.called", {"call_id": "c1", "tool": "search", "arguments": '{"q": "茶"}'}),
        ("tool.result", {"call_id": "c1", "tool": "search", "content": "结果 result " * 30}),
        ("fact.asserted", {"namespace": "prefs", "key": "drink", "value": "绿茶"}),
        ("fact.retracted", {"namespace": "prefs", "key": "drink", "reason": "changed"}),
        ("persona.updated", {"name": "小助手", "preferences": {"语言": "中文", "tone": "warm"}}),
        ("memory.recalled", {"query": "tea 茶", "memory_ids": ["m1", "m2"], "scores": [0.9, 0.1]}),
        ("feedback.given", {"memory_id": "m1", "useful": False, "correction": "红茶"}),
        ("clock.tick", {"partition": 3, "interval_s": 60.0}),
        ("subject.erasure_requested", {"subject": "u-1", "requested_at": T0.isoformat()}),
        ("session.ended", {"reason": "done"}),
    ]
    codec = Codec()
    events = []
    for i, (kind, body) in enumerate(bodies):
        obj = {
            "event_id": str(uuid5(NAMESPACE, f"{agent_id}:{i}")),
            "type": kind,
            "agent_id": agent_id,
            "session_id": "s-1",
            "user_id": "u-1",
            "occurred_at": (T0 + timedelta(seconds=i)).isoformat(),
            "body": body,
        }
        events.append(codec.from_json_object(obj))
    return events


def seed_events() -> list[Event]:
    """The raw events plus every derived event the fold makes of them."""
    raw = raw_events()
    memory = AgentMemory.empty("fuzz-agent", MemoryConfig())
    derived = [d for event in raw for d in memory.apply(event).derived]
    return raw + derived


def seed_corpus(codec: Codec) -> list[bytes]:
    """Valid encodings of the seed events: Avro single-object and JSON."""
    events = seed_events()
    return [codec.encode(e) for e in events] + [codec.encode_json(e) for e in events]


# -- mutations ------------------------------------------------------------------------


def flip_bit(data: bytes, rng: random.Random, corpus: Sequence[bytes]) -> bytes:
    if not data:
        return data
    i = rng.randrange(len(data))
    return data[:i] + bytes([data[i] ^ (1 << rng.randrange(8))]) + data[i + 1 :]


def set_byte(data: bytes, rng: random.Random, corpus: Sequence[bytes]) -> bytes:
    if not data:
        return data
    i = rng.randrange(len(data))
    value = rng.choice((0x00, 0x01, 0x7F, 0x80, 0xFF, 0x22, 0x5C, 0x7B, rng.randrange(256)))
    return data[:i] + bytes([value]) + data[i + 1 :]


def truncate(data: bytes, rng: random.Random, corpus: Sequence[bytes]) -> bytes:
    return data[: rng.randrange(len(data) + 1)]


def insert(data: bytes, rng: random.Random, corpus: Sequence[bytes]) -> bytes:
    i = rng.randrange(len(data) + 1)
    return data[:i] + rng.randbytes(rng.randrange(1, 9)) + data[i:]


def delete(data: bytes, rng: random.Random, corpus: Sequence[bytes]) -> bytes:
    if not data:
        return data
    i = rng.randrange(len(data))
    return data[:i] + data[i + rng.randrange(1, 9) :]


def splice(data: bytes, rng: random.Random, corpus: Sequence[bytes]) -> bytes:
    """The head of this input and the tail of another valid one."""
    other = rng.choice(corpus)
    return data[: rng.randrange(len(data) + 1)] + other[rng.randrange(len(other) + 1) :]


def swap_fingerprint(data: bytes, rng: random.Random, corpus: Sequence[bytes]) -> bytes:
    """Another event's Avro header on this body: type confusion."""
    headers = [c[:10] for c in corpus if c[:2] == MAGIC]
    return rng.choice(headers) + data[10:] if data[:2] == MAGIC else data


def repeat_chunk(data: bytes, rng: random.Random, corpus: Sequence[bytes]) -> bytes:
    if not data:
        return data
    i = rng.randrange(len(data))
    j = min(len(data), i + rng.randrange(1, 33))
    return data[:j] + data[i:j] * rng.randrange(1, 5) + data[j:]


Mutation = Callable[[bytes, random.Random, Sequence[bytes]], bytes]
MUTATIONS: tuple[Mutation, ...] = (
    flip_bit,
    set_byte,
    truncate,
    insert,
    delete,
    splice,
    swap_fingerprint,
    repeat_chunk,
)


def mutant(rng: random.Random, corpus: Sequence[bytes]) -> bytes:
    """A valid encoding with one to four mutations applied."""
    data = rng.choice(corpus)
    for _ in range(rng.randrange(1, 5)):
        data = rng.choice(MUTATIONS)(data, rng, corpus)
    return data


def garbage(rng: random.Random, corpus: Sequence[bytes]) -> bytes:
    """Random bytes, sometimes behind a valid Avro header or a ``{``."""
    body = rng.randbytes(rng.randrange(0, 300))
    start = rng.random()
    if start < 0.3:
        return rng.choice([c[:10] for c in corpus if c[:2] == MAGIC]) + body
    if start < 0.4:
        return b"{" + body
    return body


# -- the contract ---------------------------------------------------------------------


class ContractBroken(AssertionError):
    """``decode`` did something other than return a valid event or raise BadEvent."""


def check(codec: Codec, raw: bytes) -> str | None:
    """Decode ``raw`` under the contract; the kind of refusal (the reason up to its
    first colon), or None for a valid event. Raises ContractBroken otherwise."""
    try:
        event = codec.decode(raw)
    except BadEvent as bad:
        if bad.raw != raw or not bad.reason or type(bad) is not BadEvent:
            raise ContractBroken(f"BadEvent without reason or bytes for {raw!r}") from None
        return reason_kind(bad.reason)
    except Exception as error:
        raise ContractBroken(f"decode raised {error!r} on {raw!r}") from error
    if not isinstance(event, TYPES_BY_NAME[event.type]):
        raise ContractBroken(f"decoded a {type(event).__name__} as {event.type}")
    for again in (codec.encode, codec.encode_json):
        try:
            back = codec.decode(again(event))
        except Exception as error:
            raise ContractBroken(f"{event!r} decoded but does not round-trip: {error!r}") from None
        if back != event:
            raise ContractBroken(f"{event!r} round-trips to {back!r}")
    return None


def reason_kind(reason: str) -> str:
    """``"invalid interaction.recorded: body.role: ..."`` -> ``"invalid"``."""
    head = reason.split(":", 1)[0]
    for kind in (
        "malformed Avro body",
        "malformed JSON",
        "invalid",
        "unknown event type",
        "unknown Avro schema fingerprint",
        "truncated Avro header",
        "not an engram event",
        "event type",
        "empty message",
        "event is",
        "type",
        "an event must be a JSON object",
    ):
        if head.startswith(kind):
            return kind
    return head[:40]


@dataclass
class Tally:
    inputs: int = 0
    decoded: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    broken: list[str] = field(default_factory=list)

    def add(self, codec: Codec, raw: bytes) -> None:
        self.inputs += 1
        try:
            kind = check(codec, raw)
        except ContractBroken as error:
            self.broken.append("".join(traceback.format_exception(error))[-2000:])
            return
        if kind is None:
            self.decoded += 1
        else:
            self.refused[kind] += 1

    def report(self, seconds: float) -> str:
        lines = [
            f"inputs tried:     {self.inputs}",
            f"decoded (valid):  {self.decoded}",
            f"refused (BadEvent): {sum(self.refused.values())}",
            *(f"  {kind}: {n}" for kind, n in self.refused.most_common()),
            f"contract broken:  {len(self.broken)}",
            f"time: {seconds:.1f}s ({self.inputs / max(seconds, 1e-9):.0f} inputs/s)",
        ]
        return "\n".join(lines)


def run_random(inputs: int, seed: int, max_bytes: int) -> Tally:
    """``inputs`` inputs: 70% mutated valid events, 30% garbage; seeded, repeatable."""
    codec = Codec(max_bytes=max_bytes)
    corpus = seed_corpus(codec)
    rng = random.Random(seed)
    tally = Tally()
    for raw in corpus:
        tally.add(codec, raw)
    for _ in range(inputs - len(corpus)):
        raw = mutant(rng, corpus) if rng.random() < 0.7 else garbage(rng, corpus)
        tally.add(codec, raw)
    return tally


def run_atheris(inputs: int, max_bytes: int) -> None:  # pragma: no cover - needs atheris
    """Coverage-guided: libFuzzer drives, the contract check is the oracle."""
    atheris = importlib.import_module("atheris")  # optional: a fuzzing tool, not a dependency

    codec = Codec(max_bytes=max_bytes)
    seeds = Path(tempfile.mkdtemp(prefix="engram-fuzz-"))
    for i, raw in enumerate(seed_corpus(codec)):
        (seeds / f"seed-{i}").write_bytes(raw)
    tally = Tally()

    def one_input(raw: bytes) -> None:
        tally.add(codec, raw)
        if tally.broken:
            print(tally.broken[-1], file=sys.stderr)
            raise ContractBroken("decode broke its contract")
        if tally.inputs % 100_000 == 0:
            print(f"{tally.report(time.monotonic() - started)}\n", flush=True)
        if tally.inputs == inputs:
            print(tally.report(time.monotonic() - started), flush=True)

    atheris.instrument_all()
    atheris.Setup([sys.argv[0], f"-runs={inputs}", f"-max_len={max_bytes}", str(seeds)], one_input)
    started = time.monotonic()
    atheris.Fuzz()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.fuzz", description=__doc__.split("\n")[0])
    parser.add_argument("--inputs", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-bytes", type=int, default=4096, help="the codec's size limit")
    parser.add_argument("--engine", choices=("random", "atheris"), default="random")
    args = parser.parse_args(argv)
    if args.engine == "atheris":
        run_atheris(args.inputs, args.max_bytes)
        return 0
    started = time.monotonic()
    tally = run_random(args.inputs, args.seed, args.max_bytes)
    print(tally.report(time.monotonic() - started))
    for failure in tally.broken[:5]:
        print(failure, file=sys.stderr)
    return 1 if tally.broken else 0


if __name__ == "__main__":
    sys.exit(main())
