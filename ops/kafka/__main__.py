"""``python -m ops.kafka``: Apache Kafka in the foreground until Ctrl-C.

``--check`` only says whether it can run here (exit 3 and the reason when not);
``--collect`` only collects the jars and prints where they are.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from types import FrameType

from ops.kafka import ApacheKafka, KafkaError, available, collect_jars

UNAVAILABLE = 3


def _interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signum)


def serve(directory: Path | None, port: int | None) -> int:
    signal.signal(signal.SIGTERM, _interrupt)
    kafka = ApacheKafka(directory, port=port)
    try:
        started = time.monotonic()
        kafka.start()
        print(kafka.bootstrap, flush=True)
        print(
            f"Apache Kafka {kafka.version} up in {time.monotonic() - started:.1f}s"
            f" (pid {kafka.pid}, data {kafka.data_dir}, log {kafka.log_path}); Ctrl-C stops it",
            file=sys.stderr,
            flush=True,
        )
        while kafka.running():
            time.sleep(0.5)
        print(f"Apache Kafka exited; see {kafka.log_path}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        kafka.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.kafka", description=__doc__)
    parser.add_argument("--dir", type=Path, help="keep config and log here (default: a temp dir)")
    parser.add_argument("--port", type=int, help="broker port (default: a free one)")
    parser.add_argument("--check", action="store_true", help="only say whether it can run")
    parser.add_argument("--collect", action="store_true", help="only collect the jars")
    args = parser.parse_args(argv)
    reason = available()
    if reason is not None:
        print(reason)
        return UNAVAILABLE
    if args.check:
        print("Apache Kafka can run here")
        return 0
    try:
        if args.collect:
            print(collect_jars())
            return 0
        return serve(args.dir, args.port)
    except KafkaError as failed:
        print(failed, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
