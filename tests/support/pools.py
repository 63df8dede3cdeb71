"""What a test holds a worker's memory to once its requests are done."""
from __future__ import annotations

import time


def pool_is_whole(engine, model: str) -> None:
    """Every KV block (and a hybrid's state slot) of model's worker is back in its pool."""
    worker = engine.session(model).worker
    for _ in range(200):  # the worker releases a request just after its handle ends
        if not worker.scheduler.running:
            break
        time.sleep(0.01)
    worker.kv.check([])
    assert worker.kv.reserved == 0 and worker.kv.available() == worker.kv.n_blocks
