"""The actions: drain a node in Slurm, taint it in Kubernetes, tell a webhook; and their undo.

Each ``apply`` returns ``done`` or ``foreign_drain`` (the node is already out of service by someone else:
left alone, and never undone by fabricmon) and raises ``ActionError`` on a failure the executor retries.
Each ``undo`` touches only what carries fabricmon's mark (the reason prefix, its own taint key) and
returns ``done`` or ``foreign_drain`` (an operator took the node over: left alone).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from .config import KubernetesSettings, SlurmSettings, WebhookSettings
from .policy import REASON_PREFIX


class ActionError(Exception):
    """An action that failed (the executor retries it with backoff, then counts it ``failed``)."""


class Action(Protocol):
    name: str

    def apply(self, node: str, reason: str, incident: dict[str, Any]) -> str: ...

    def undo(self, node: str, reason: str) -> str: ...


# ---------------------------------------------------------------------------------------------- Slurm
# ``scontrol show node NAME -o``: one line of Key=Value; Reason= runs to the end of the line, followed by
# `` [user@time]`` (slurm 22.05 src/api/node_info.c: "Reason=%s [%s@%s]").
_STATE = re.compile(r"(?:^| )State=(\S+)")
_REASON = re.compile(r" Reason=(.*?)(?: \[[^\]]*@[^\]]*\])?\s*$")


@dataclass(frozen=True, slots=True)
class SlurmNode:
    state: str  # IDLE+DRAIN, MIXED, DOWN*+DRAIN ...
    reason: str

    @property
    def drained(self) -> bool:
        flags = set(re.split(r"[+*]", self.state.upper()))
        return bool(flags & {"DRAIN", "DRAINING", "DRAINED", "DOWN", "FAIL", "FAILING", "MAINT", "REBOOT_ISSUED"})


def parse_show_node(text: str) -> SlurmNode:
    """The state and reason of ``scontrol show node NAME -o``'s line."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    st = _STATE.search(line)
    if st is None:
        raise ActionError(f"scontrol show node: no State= in {line[:200]!r}")
    rs = _REASON.search(line)
    return SlurmNode(st.group(1), rs.group(1).strip() if rs else "")


class SlurmDrain:
    name = "slurm_drain"

    def __init__(self, s: SlurmSettings) -> None:
        self.s = s

    def _scontrol(self, *args: str) -> str:
        binary = shutil.which(self.s.scontrol) or self.s.scontrol
        try:
            out = subprocess.run([binary, *args], capture_output=True, text=True, timeout=self.s.timeout_s,
                                 stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ActionError(f"scontrol {args[0]}: {exc}") from None
        if out.returncode != 0:
            raise ActionError(f"scontrol {' '.join(args[:2])}: exit {out.returncode}: "
                              f"{(out.stderr or out.stdout).strip()[:300]}")
        return out.stdout

    def show(self, node: str) -> SlurmNode:
        return parse_show_node(self._scontrol("show", "node", node, "-o"))

    def apply(self, node: str, reason: str, incident: dict[str, Any]) -> str:
        now = self.show(node)
        if now.reason.startswith(REASON_PREFIX) and now.drained:
            return "done"  # fabricmon's own drain (a restart, a second incident): nothing to add
        if now.drained or now.reason:
            return "foreign_drain"  # an operator's or another tool's: never touched
        self._scontrol("update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")
        return "done"

    def undo(self, node: str, reason: str) -> str:
        now = self.show(node)
        if not now.reason.startswith(REASON_PREFIX):
            # resumed already (nothing left to undo), or drained again by someone else (theirs now)
            return "foreign_drain" if now.drained or now.reason else "done"
        self._scontrol("update", f"NodeName={node}", "State=RESUME")
        return "done"


# ---------------------------------------------------------------------------------------------- Kubernetes
TAINT_KEY = "fabricmon.io/fabric-fault"
CONDITION = "FabricHealthy"
REASON_ANNOTATION = "fabricmon.io/remediation-reason"


def _rfc3339(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


class K8sTaint:
    """Taint ``fabricmon.io/fabric-fault=<alertname>:NoSchedule`` and condition ``FabricHealthy=False``.

    The requests (Kubernetes API reference, core/v1 Node; k8s.io/api core/v1/types.go):
    ``GET /api/v1/nodes/{name}``; ``PATCH /api/v1/nodes/{name}`` as ``application/merge-patch+json`` (RFC 7386)
    carrying ``metadata.resourceVersion`` and the whole ``spec.taints`` list (NodeSpec.Taints has no patch merge
    key, so kubectl taint sends the whole list too; the resourceVersion turns a concurrent change into a 409
    Conflict, retried, never a lost taint); and ``PATCH /api/v1/nodes/{name}/status`` as
    ``application/strategic-merge-patch+json`` with ``status.conditions`` (merged by ``type``, the patch
    node-problem-detector sends: pkg/exporters/k8sexporter/problemclient/problem_client.go SetConditions).
    In-cluster credentials as client-go's rest.InClusterConfig reads them: the ServiceAccount token and CA,
    ``KUBERNETES_SERVICE_HOST``/``_PORT``.  RBAC: nodes get/patch, nodes/status patch."""

    name = "k8s_taint"

    def __init__(self, s: KubernetesSettings, wall: Any = time.time) -> None:
        self.s = s
        self.wall = wall

    def _base(self) -> str:
        if self.s.api_url:
            return self.s.api_url.rstrip("/")
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST", ""), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise ActionError("no Kubernetes API: KUBERNETES_SERVICE_HOST is not set and remediation.kubernetes."
                              "api_url is empty")
        return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None, ctype: str = "") -> dict[str, Any]:
        try:
            token = Path(self.s.token_file).read_text().strip()
            ctx = ssl.create_default_context(cafile=self.s.ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ActionError(f"in-cluster credentials: {exc}") from None
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self._base() + path, data=data, method=method, headers={
            "Authorization": f"Bearer {token}", "Accept": "application/json",
            **({"Content-Type": ctype} if ctype else {})})
        try:
            with urllib.request.urlopen(req, timeout=self.s.timeout_s, context=ctx) as resp:  # noqa: S310
                out = json.loads(resp.read(4 * 1024 * 1024) or b"{}")
        except urllib.error.HTTPError as exc:
            raise ActionError(f"{method} {path}: HTTP {exc.code}") from None
        except (OSError, ValueError) as exc:
            raise ActionError(f"{method} {path}: {exc}") from None
        if not isinstance(out, dict):
            raise ActionError(f"{method} {path}: not an object")
        return out

    def _node(self, node: str) -> dict[str, Any]:
        return self._call("GET", f"/api/v1/nodes/{urllib.parse.quote(node, safe='')}")

    def _taints(self, node: str, obj: dict[str, Any], taints: list[dict[str, Any]], reason: str | None) -> None:
        ann: dict[str, Any] = {REASON_ANNOTATION: reason}
        self._call("PATCH", f"/api/v1/nodes/{urllib.parse.quote(node, safe='')}",
                   {"metadata": {"resourceVersion": obj.get("metadata", {}).get("resourceVersion", ""),
                                 "annotations": ann},
                    "spec": {"taints": taints}}, "application/merge-patch+json")

    def _condition(self, node: str, healthy: bool, reason: str, message: str) -> None:
        now = _rfc3339(self.wall())
        self._call("PATCH", f"/api/v1/nodes/{urllib.parse.quote(node, safe='')}/status",
                   {"status": {"conditions": [{"type": CONDITION, "status": "True" if healthy else "False",
                                               "reason": reason, "message": message[:1024],
                                               "lastHeartbeatTime": now, "lastTransitionTime": now}]}},
                   "application/strategic-merge-patch+json")

    def apply(self, node: str, reason: str, incident: dict[str, Any]) -> str:
        obj = self._node(node)
        spec = obj.get("spec") or {}
        taints = [t for t in (spec.get("taints") or []) if isinstance(t, dict)]
        if any(t.get("key") == TAINT_KEY for t in taints):
            return "done"  # already fabricmon's
        if spec.get("unschedulable"):
            return "foreign_drain"  # cordoned by an operator or another tool: never touched
        alert = str(incident.get("alertname", "fault"))
        self._taints(node, obj, [*taints, {"key": TAINT_KEY, "value": alert, "effect": "NoSchedule"}], reason)
        self._condition(node, False, "FabricmonFault", reason)
        return "done"

    def undo(self, node: str, reason: str) -> str:
        obj = self._node(node)
        taints = [t for t in ((obj.get("spec") or {}).get("taints") or []) if isinstance(t, dict)]
        kept = [t for t in taints if t.get("key") != TAINT_KEY]
        if len(kept) != len(taints):
            self._taints(node, obj, kept, None)
        self._condition(node, True, "FabricmonClear", "fabricmon: the fault resolved and stayed clear")
        return "done"


# ---------------------------------------------------------------------------------------------- webhook
class Webhook:
    name = "webhook"

    def __init__(self, s: WebhookSettings) -> None:
        self.s = s

    def _post(self, body: dict[str, Any]) -> None:
        req = urllib.request.Request(self.s.url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.s.timeout_s) as resp:  # noqa: S310
                resp.read(65536)
        except urllib.error.HTTPError as exc:
            raise ActionError(f"webhook: HTTP {exc.code}") from None
        except OSError as exc:
            raise ActionError(f"webhook: {exc}") from None

    def apply(self, node: str, reason: str, incident: dict[str, Any]) -> str:
        self._post({"event": "remediate", "node": node, "reason": reason, "incident": incident})
        return "done"

    def undo(self, node: str, reason: str) -> str:
        self._post({"event": "undo", "node": node, "reason": reason})
        return "done"


def build_actions(names: set[str], slurm: SlurmSettings, k8s: KubernetesSettings,
                  webhook: WebhookSettings) -> dict[str, Action]:
    table: dict[str, Action] = {}
    if "slurm_drain" in names:
        table["slurm_drain"] = SlurmDrain(slurm)
    if "k8s_taint" in names:
        table["k8s_taint"] = K8sTaint(k8s)
    if "webhook" in names:
        table["webhook"] = Webhook(webhook)
    return table
