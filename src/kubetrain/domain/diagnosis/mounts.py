"""Why the kubelet (or the attach/detach controller) cannot mount a Pod's volume, by
cause, from their events' words (Kubernetes 1.33, recorded from a real kubelet):

* `MountVolume.SetUp failed for volume "cfg" : configmap "x" not found` (and `secret`,
  and a projected volume's sources, several in one `[…, …]`): the user's object is
  missing from the namespace -> VOLUME_SOURCE_NOT_FOUND;
* `hostPath type check failed: /data is not a directory`, a local volume's
  `path "/mnt/x" does not exist`: the path is not on the node -> VOLUME_PATH_NOT_FOUND;
* the attach/detach controller's `Multi-Attach error for volume "v" Volume is already
  used by pod(s) a, b` (or `… exclusively attached to one node …`): another Pod holds a
  ReadWriteOnce volume -> VOLUME_MULTI_ATTACH, waitable;
* anything else (a CSI driver not registered, an attach that failed or timed out, the
  node's mount tools): the platform's storage -> VOLUME_MOUNT_FAILED.

The kubelet's summary after two minutes ("Unable to attach or mount volumes:
unmounted volumes=[…] … timed out waiting for the condition") names no cause; it is
read only when nothing else was said.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from kubetrain.domain.diagnosis.reading import _event_first_time, _Finding
from kubetrain.domain.objects import text
from kubetrain.domain.reasons import rank
from kubetrain.domain.states import ReasonCode

R = ReasonCode

MOUNT_EVENTS = frozenset({"FailedMount", "FailedAttachVolume", "FailedMapVolume"})

_VOLUME = re.compile(r'for volume "([^"]+)"')
# The kubelet's secret and configmap managers: `secret "x" not found`.
_SOURCE = re.compile(r'\b(configmap|secret)s? "([^"]+)" not found', re.IGNORECASE)
_HOST_PATH = re.compile(r"hostPath type check failed: (.+?) is not an? ([a-z ]+?)\s*$")
_LOCAL_PATH = re.compile(r'path "([^"]+)" does not exist')
_MULTI_ATTACH = re.compile(r"Multi-Attach error for volume \"([^\"]+)\" (.+)$")
_SUMMARY = "Unable to attach or mount volumes"
_KIND = {"configmap": "ConfigMap", "secret": "Secret"}


def mount_code(message: str) -> ReasonCode:
    """The cause a mount or attach event's message says."""
    if _SOURCE.search(message):
        return R.VOLUME_SOURCE_NOT_FOUND
    if _HOST_PATH.search(message) or _LOCAL_PATH.search(message):
        return R.VOLUME_PATH_NOT_FOUND
    if _MULTI_ATTACH.search(message):
        return R.VOLUME_MULTI_ATTACH
    return R.VOLUME_MOUNT_FAILED


def _detail(code: ReasonCode, message: str, namespace: str | None) -> str:
    volume = _VOLUME.search(message)
    of = f' (volume "{volume[1]}")' if volume else ""
    if code is R.VOLUME_SOURCE_NOT_FOUND:
        missing = ", ".join(
            f'{_KIND[kind.lower()]} "{name}"'
            for kind, name in dict.fromkeys((m[1].lower(), m[2]) for m in _SOURCE.finditer(message))
        )
        where = f" in namespace {namespace}" if namespace else ""
        verb = "does" if "," not in missing else "do"
        return f"{missing}{where} {verb} not exist{of}"
    if code is R.VOLUME_PATH_NOT_FOUND:
        host = _HOST_PATH.search(message)
        if host:
            return f"hostPath {host[1]} is not a {host[2]} on the node{of}"
        local = _LOCAL_PATH.search(message)
        return f"path {local[1] if local else '?'} does not exist on the node{of}"
    if code is R.VOLUME_MULTI_ATTACH:
        attach = _MULTI_ATTACH.search(message)
        said = attach[2] if attach else message
        return f'volume "{attach[1] if attach else "?"}" is attached elsewhere: {said}'
    return message


def mount_findings(events: Sequence[Mapping[str, Any]], namespace: str | None) -> list[_Finding]:
    """One finding per cause the events say, the primary first (precedence), each
    from the newest event that says it; [] when there are none."""
    telling = [e for e in events if not (text(e, "message") or "").startswith(_SUMMARY)]
    newest: dict[ReasonCode, Mapping[str, Any]] = {}
    first: dict[ReasonCode, Mapping[str, Any]] = {}
    for event in telling or events:
        code = mount_code(text(event, "message") or "")
        newest[code] = event
        first.setdefault(code, event)
    return [
        _Finding(
            code,
            _detail(code, text(event, "message") or "", namespace),
            raw_reason=text(event, "reason"),
            raw_message=text(event, "message"),
            since=_event_first_time(first[code]),
        )
        for code, event in sorted(newest.items(), key=lambda item: rank(item[0]))
    ]
