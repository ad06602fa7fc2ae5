"""Run a pipeline's senders in a process of their own, until killed (the restart tests).

    python alerting_sender.py DATA_DIR CONFIG_JSON
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from sloguard.actuators.alerting.config import AlertingConfig
from sloguard.actuators.alerting.db import AlertDB
from sloguard.actuators.alerting.pipeline import Alerting


def main() -> None:
    data, config = Path(sys.argv[1]), AlertingConfig.model_validate(json.loads(sys.argv[2]))
    alerting = Alerting(config, AlertDB(data / "alerting.db"), None, "worker-7",
                        "https://sloguard.example", backoff_s=(0.2, 1.0))
    alerting.start()
    print("started", flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
