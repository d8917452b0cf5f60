"""``remote`` devices: any host already running a TVM rpc_server registered with the tracker.

farm starts nothing for them; ``farm devices`` shows whether their key is online.
"""

from __future__ import annotations

import logging
from pathlib import Path

from farm.records import Device, TrackerAddress
from farm.rpc.processes import ManagedProcess

log = logging.getLogger(__name__)


def bring_up(device: Device, tracker: TrackerAddress, state_dir: Path) -> list[ManagedProcess]:
    log.info("%s is a remote device: start its rpc_server with --tracker %s --key %s", device.name, tracker, device.key)
    return []
