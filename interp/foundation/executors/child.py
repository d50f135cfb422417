"""One shard in a process of its own (:class:`interp.foundation.executors.local.LocalExecutor`)::

    python -m interp.foundation.executors.child JOB.pkl INDEX COUNT OUT.json [SETUP]

sets the worker up (``SETUP``: JSON of :func:`interp.foundation.executors.call.set_up_worker`'s
arguments, its threads and GPU: applied before the job is unpickled, so before it imports
torch), loads the pickled job, runs shard ``INDEX`` of ``COUNT`` and writes ``{"result": ...}``
or ``{"error": ..., "transient": ...}`` to ``OUT.json`` in one rename. A process killed before
that leaves no file: the executor reads its exit status instead.
"""

from __future__ import annotations

import json
import pickle
import sys

from interp.foundation.executors.call import call_shard, set_up_worker
from interp.foundation.files import write_text_atomic


def main(argv: list[str] | None = None) -> int:
    argv = argv if argv is not None else sys.argv[1:]
    job_file, index, count, out = argv[:4]
    if len(argv) > 4:
        set_up_worker(**json.loads(argv[4]))
    with open(job_file, "rb") as f:
        job = pickle.load(f)
    write_text_atomic(out, json.dumps(call_shard(job, int(index), int(count))) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
