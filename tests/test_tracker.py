"""The tracker's view of a key, as `farm devices` and the dashboard state it."""

from farm.rpc.tracker import KeyStatus, key_state


def test_key_state_online_busy_missing():
    assert key_state(KeyStatus("phone", servers=2, free=1, pending=0)) == "online"
    assert key_state(KeyStatus("phone", servers=2, free=0, pending=3)) == "busy"
    assert key_state(KeyStatus("phone", servers=0, free=0, pending=1)) == "missing"  # requests wait, nobody serves
    assert key_state(None) == "missing"  # the summary does not list the key
