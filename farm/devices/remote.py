"""``remote`` devices: any host already running a TVM rpc_server registered with the tracker.

farm starts nothing for them; ``farm devices`` shows whether their key is online.
"""

from __future__ import annotations

import logging
from pathlib import Path

from farm.devices.kind import DeviceKind
from farm.records import Device, TrackerAddress
from farm.procs.registry import ManagedProcess

log = logging.getLogger(__name__)


class Remote(DeviceKind):
    name = "remote"
    summary = "any host whose TVM rpc_server you start yourself, registered under the device's key"
    serve_help = "nothing (start its rpc_server with --tracker and --key yourself)"
    example = 'key = "x86-ci"\ntarget = { kind = "llvm", mcpu = "skylake" }'

    def bring_up(self, device: Device, tracker: TrackerAddress, state_dir: Path) -> list[ManagedProcess]:
        log.info("%s is a remote device: start its rpc_server with --tracker %s --key %s", device.name, tracker, device.key)
        return []
