"""What the web pages show, computed from stored rows and cluster objects: chip colours,
counts per reason, the timeline's lanes, node bars, quota bars, the checkpoint table
(the chart is chart.py; a job's facts in words are kubetrain.domain.facts, shared with
the CLI).

Pure (time is passed in), so the pages' arithmetic is tested without a browser;
the templates only lay the values out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from kubetrain.domain.facts import byte_size, save_seconds
from kubetrain.domain.inventory import Inventory, NodeRow
from kubetrain.domain.nodes import is_gpu_resource
from kubetrain.domain.objects import as_map, meta_name, meta_namespace
from kubetrain.domain.quantity import QuantityError, format_quantity, parse_quantity
from kubetrain.domain.reasons import CATALOG, Actor
from kubetrain.domain.states import TERMINAL, BusinessState, ReasonCode

R = ReasonCode

# The words of the counts line ("12 waiting for GPU"); other codes read as their name.
REASON_WORDS: dict[ReasonCode, str] = {
    R.JOB_NOT_CREATED: "not created yet",
    R.WAITING_FOR_QUOTA: "waiting for quota",
    R.QUEUE_INACTIVE: "queue inactive",
    R.NO_GPU_NODES: "no GPU nodes",
    R.INSUFFICIENT_GPU: "waiting for GPU",
    R.INSUFFICIENT_CPU: "waiting for CPU",
    R.INSUFFICIENT_MEMORY: "waiting for memory",
    R.UNTOLERATED_TAINT: "blocked by a taint",
    R.NODE_SELECTOR_MISMATCH: "no matching node",
    R.FLAVOR_NODE_MISMATCH: "no node for the flavor",
    R.NODE_NOT_READY: "node not ready",
    R.PVC_NOT_FOUND: "volume claim missing",
    R.PVC_UNBOUND: "waiting for a volume",
    R.VOLUME_SOURCE_NOT_FOUND: "mounted object missing",
    R.VOLUME_PATH_NOT_FOUND: "volume path missing",
    R.VOLUME_MULTI_ATTACH: "volume held elsewhere",
    R.SIDECAR_RESTARTING: "sidecar restarting",
    R.IMAGE_PULL_FAILED: "image pull failed",
    R.CONTAINER_CONFIG_ERROR: "container config error",
    R.CONTAINER_CREATING: "starting container",
    R.SCHEDULING: "being scheduled",
    R.GANG_PARTIAL: "gang partly placed",
    R.RENDEZVOUS: "ranks meeting",
    R.PREFLIGHT: "in preflight",
    R.NO_PROGRESS: "no progress",
    R.TRAINING: "training",
    R.PREFLIGHT_FAILED: "preflight failed",
    R.CRASH_LOOP: "crash looping",
    R.OOM_KILLED: "out of memory",
    R.EXIT_NONZERO: "exited with an error",
    R.CANCELLED: "cancelled",
    R.COMPLETED: "completed",
}


def reason_words(code: ReasonCode) -> str:
    return REASON_WORDS.get(code, code.value.lower().replace("_", " "))


def state_class(state: BusinessState) -> str:
    return f"state-{state.value.lower()}"


def reason_class(state: BusinessState, code: ReasonCode) -> str:
    """The chip colour: green done, red failed, by who must act while waiting."""
    if state == BusinessState.SUCCEEDED:
        return "chip-ok"
    if state == BusinessState.FAILED:
        return "chip-bad"
    if state == BusinessState.CANCELLED:
        return "chip-muted"
    actor = CATALOG[code].actor
    return {Actor.USER: "chip-user", Actor.PLATFORM: "chip-platform"}.get(actor, "chip-active")


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


@dataclass(frozen=True)
class ReasonCount:
    state: BusinessState
    reason: ReasonCode
    count: int

    @property
    def words(self) -> str:
        return f"{self.count} {reason_words(self.reason)}"


def reason_counts(rows: Iterable[tuple[BusinessState, ReasonCode, int]]) -> list[ReasonCount]:
    """Unfinished jobs first (what someone may act on), then the most frequent."""
    counts = [ReasonCount(state, reason, count) for state, reason, count in rows]
    return sorted(counts, key=lambda c: (c.state in TERMINAL, -c.count, c.reason.value))


# -- the timeline ----------------------------------------------------------------


@dataclass(frozen=True)
class TimelineRow:
    at: datetime
    lane: int  # 0: the business state; n: attempt n
    title: str
    text: str | None
    kind: str  # "business" | "runtime"


@dataclass(frozen=True)
class Timeline:
    lanes: list[str]
    rows: list[TimelineRow]


def _change(field: str, value: Any) -> str:
    """A runtime row's detail holds [old, new] per changed field."""
    if isinstance(value, list) and len(value) == 2:
        old, new = value
        return f"{field}: {'-' if old is None else old} → {'-' if new is None else new}"
    return f"{field}: {value}"


def timeline(entries: Sequence[Any]) -> Timeline:
    """History entries (HistoryEntry) as rows in lanes: the job's own, then one per attempt."""
    attempts = sorted({e.attempt for e in entries if e.kind == "runtime" and e.attempt})
    lane_of = {number: i + 1 for i, number in enumerate(attempts)}
    rows = []
    for entry in entries:
        if entry.kind == "business":
            title = f"{entry.from_state or '-'} → {entry.to_state}"
            if entry.to_reason:
                title += f" ({entry.to_reason})"
            # Kubernetes' words, else kubetrain's own (a cancel for no progress says why).
            said = entry.raw_message or entry.raw_reason or (entry.detail or {}).get("message")
            rows.append(TimelineRow(entry.at, 0, title, said, "business"))
            continue
        detail = entry.detail or {}
        # The syncer writes {"changed": {field: [old, new]}, "pod_name": ..., "pod_uid": ...};
        # the lane already names the attempt.
        fields = detail.get("changed")
        if not isinstance(fields, dict):
            fields = {k: v for k, v in detail.items() if k not in ("pod_name", "pod_uid")}
        changed = "; ".join(_change(k, v) for k, v in sorted(fields.items()))
        title = entry.to_state or "changed"
        if entry.raw_reason:
            title += f" ({entry.raw_reason})"
        rows.append(
            TimelineRow(
                entry.at, lane_of.get(entry.attempt or 0, 0), title, changed or None, "runtime"
            )
        )
    lanes = ["job", *(f"attempt {n}" for n in attempts)]
    return Timeline(lanes, rows)


# -- bars --------------------------------------------------------------------------


@dataclass(frozen=True)
class Bar:
    """One horizontal bar: `used` of `total`, drawn in SVG units of 0..100."""

    label: str
    used: Decimal
    total: Decimal
    capacity: Decimal | None = None  # drawn as a faint frame when above `total`
    unit: str = ""

    @property
    def percent(self) -> float:
        if self.total <= 0:
            return 0.0
        return float(min(self.used / self.total, Decimal(1)) * 100)

    @property
    def level(self) -> str:
        """The fill's colour: how close to full."""
        share = self.percent
        return "full" if share >= 100 else "high" if share >= 75 else "ok"

    @property
    def free(self) -> Decimal:
        return max(self.total - self.used, Decimal(0))

    def text(self) -> str:
        q = format_quantity
        words = f"{q(self.used)} of {q(self.total)}{self.unit} used, {q(self.free)} free"
        if self.capacity is not None and self.capacity != self.total:
            words += f" (capacity {q(self.capacity)})"
        return words


@dataclass
class NodeView:
    row: NodeRow
    gpu: Bar | None
    cpu: Bar
    memory: Bar

    @property
    def health(self) -> list[tuple[str, str]]:
        """(text, css class) chips: readiness, pressure, cordon."""
        chips = []
        ready = self.row.conditions.get("Ready")
        chips.append(("Ready", "chip-ok") if ready == "True" else (f"Ready={ready}", "chip-bad"))
        for condition in ("DiskPressure", "MemoryPressure"):
            if self.row.conditions.get(condition) == "True":
                chips.append((condition, "chip-bad"))
        if self.row.cordoned:
            chips.append(("cordoned", "chip-platform"))
        return chips


@dataclass
class NodeGroup:
    accelerator: str  # the label's value, or "no accelerator"
    nodes: list[NodeView] = field(default_factory=list)
    supply: Bar | None = None  # GPUs in use of allocatable, over the group
    demand: int = 0  # GPUs asked for by waiting jobs of this type


def _node_view(row: NodeRow) -> NodeView:
    gpu = None
    if row.gpu_resource is not None:
        gpu = Bar(row.gpu_resource, row.gpu.requested, row.gpu.allocatable, row.gpu.capacity)
    cpu = Bar("cpu", row.cpu.requested, row.cpu.allocatable, row.cpu.capacity)
    memory = Bar("memory", row.memory.requested, row.memory.allocatable, row.memory.capacity)
    return NodeView(row, gpu, cpu, memory)


NO_ACCELERATOR = "no accelerator"


def node_groups(found: Inventory, demand: Mapping[str, int]) -> list[NodeGroup]:
    """Nodes grouped by accelerator label, GPU groups first; `demand` is GPUs asked for
    by waiting jobs per GPU type ("" for jobs that name none: they are shown apart)."""
    groups: dict[str, NodeGroup] = {}
    for row in found.nodes:
        key = row.accelerator or NO_ACCELERATOR
        groups.setdefault(key, NodeGroup(key)).nodes.append(_node_view(row))
    for group in groups.values():
        gpus = [n for n in group.nodes if n.gpu is not None]
        if gpus:
            used = sum((n.row.gpu.requested for n in gpus), Decimal(0))
            total = sum((n.row.gpu.allocatable for n in gpus), Decimal(0))
            group.supply = Bar("GPUs", used, total)
        group.demand = demand.get(group.accelerator, 0)
    return sorted(groups.values(), key=lambda g: (g.supply is None, g.accelerator))


def _workers(spec: Mapping[str, Any]) -> int:
    workers = as_map(spec, "spec").get("workers", 1)
    return workers if isinstance(workers, int) and not isinstance(workers, bool) else 1


def gpu_shape(spec: Mapping[str, Any]) -> str:
    """A job's GPUs as the pages show them: "8", or per worker for a gang ("2x8")."""
    gpus = as_map(spec, "spec", "resources").get("gpus", 0)
    gpus = gpus if isinstance(gpus, int) and not isinstance(gpus, bool) else 0
    workers = _workers(spec)
    return f"{workers}x{gpus}" if workers > 1 else str(gpus)


def gpu_demand(specs: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """GPUs per GPU type that waiting jobs ask for, from their TrainingJob documents
    (a gang's GPUs are per worker)."""
    demand: dict[str, int] = {}
    for spec in specs:
        resources = as_map(spec, "spec", "resources")
        gpus = resources.get("gpus")
        if isinstance(gpus, int) and gpus > 0:
            kind = resources.get("gpuType")
            key = kind if isinstance(kind, str) else ""
            demand[key] = demand.get(key, 0) + gpus * _workers(spec)
    return demand


# -- quotas ------------------------------------------------------------------------


@dataclass(frozen=True)
class QuotaView:
    namespace: str
    name: str
    bars: list[Bar]


def _quota_rank(resource: str) -> tuple[int, str]:
    bare = resource.split(".", 1)[1] if resource.startswith(("requests.", "limits.")) else resource
    if is_gpu_resource(bare):
        return 0, resource
    return {"cpu": 1, "memory": 2}.get(bare, 3), resource


def quotas(items: Iterable[Mapping[str, Any]], namespaces: set[str] | None) -> list[QuotaView]:
    """ResourceQuotas (in `namespaces`, None: all) as used-of-hard bars, GPU first, cpu,
    memory, then the rest; a value that is no quantity is left out."""
    views = []
    for quota in items:
        if quota.get("kind") != "ResourceQuota":
            continue
        namespace = meta_namespace(quota)
        if namespaces is not None and namespace not in namespaces:
            continue
        hard = as_map(quota, "status", "hard") or as_map(quota, "spec", "hard")
        used = as_map(quota, "status", "used")
        bars = []
        for resource in sorted((k for k in hard if isinstance(k, str)), key=_quota_rank):
            try:
                limit = parse_quantity(hard[resource])
                in_use = parse_quantity(used.get(resource, "0"))
            except QuantityError:
                continue
            bars.append(Bar(resource, in_use, limit))
        views.append(QuotaView(namespace, meta_name(quota) or "", bars))
    return sorted(views, key=lambda v: (v.namespace, v.name))


@dataclass(frozen=True)
class CheckpointRow:
    step: int
    size: str  # "12.3 MiB", "4.2 KiB"
    save: str  # how long the save took: "0.50 s"
    attempt: int | None  # the attempt whose Pod wrote it, where known
    pod: str
    at: datetime
    # (what, value) of its binding: dataset version, code version, params digest;
    # empty: the runtime that wrote it did not report one.
    binding: tuple[tuple[str, str], ...] = ()
    resumed_from: bool = False  # a resume started from it (set by `fold_checkpoints`)


# The binding fields as the table says them; digests are cut to this many characters.
_BINDING_SHOWN = (
    ("dataset_version", "dataset"),
    ("code_version", "code"),
    ("params_sha256", "params"),
)
_DIGEST_SHOWN = 19  # "sha256:" and 12 hex digits


def _binding_cells(binding: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(binding, Mapping):
        return ()
    cells = []
    for key, said in _BINDING_SHOWN:
        value = binding.get(key)
        text = "unset" if value is None else str(value)
        cells.append(
            (said, text if len(text) <= _DIGEST_SHOWN else text[: _DIGEST_SHOWN - 1] + "…")
        )
    return tuple(cells)


def checkpoint_rows(
    reports: Iterable[tuple[str, Mapping[str, Any], datetime]], attempts: Mapping[str, int]
) -> list[CheckpointRow]:
    """Checkpoint reports (pod, data, reported at) as the job page's table, newest first."""
    rows = [
        CheckpointRow(
            step=int(data["step"]),
            size=byte_size(int(data.get("sizeBytes") or 0)),
            save=save_seconds(float(data.get("durationSeconds") or 0.0)),
            attempt=attempts.get(pod),
            pod=pod,
            at=at,
            binding=_binding_cells(data.get("binding")),
        )
        for pod, data, at in reports
    ]
    return rows[::-1]


NEWEST_CHECKPOINTS = 3  # rows the job page shows before "show all N"
MOST_OPEN_ROWS = 10  # never more rows open at once, however many resumes


@dataclass(frozen=True)
class FoldedCheckpoints:
    """The checkpoint table folded: `shown` open, `more` behind a disclosure."""

    shown: list[CheckpointRow]
    more: list[CheckpointRow]

    @property
    def total(self) -> int:
        return len(self.shown) + len(self.more)


def fold_checkpoints(
    rows: Sequence[CheckpointRow],
    resumed_from: Iterable[tuple[int, str | None]],
    *,
    newest: int = NEWEST_CHECKPOINTS,
) -> FoldedCheckpoints:
    """The newest `newest` rows, and each one a resume started from (its step, and the
    Pod that wrote it where the lineage knows it), open; the rest folded. Newest first,
    and at most MOST_OPEN_ROWS open: a run resumed many times keeps its latest resumes."""
    starts = list(resumed_from)

    def started_a_resume(row: CheckpointRow) -> bool:
        return any(row.step == step and pod in (None, row.pod) for step, pod in starts)

    marked = [replace(row, resumed_from=started_a_resume(row)) for row in rows]
    keep = set(range(min(newest, len(marked))))
    for index, row in enumerate(marked):
        if len(keep) >= MOST_OPEN_ROWS:
            break
        if row.resumed_from:
            keep.add(index)
    return FoldedCheckpoints(
        shown=[row for i, row in enumerate(marked) if i in keep],
        more=[row for i, row in enumerate(marked) if i not in keep],
    )


# -- Kueue's queues ----------------------------------------------------------------


@dataclass(frozen=True)
class QueueBar(Bar):
    """What a ClusterQueue admitted of one flavor's resource, of its nominal quota;
    above it, what the cohort lent."""

    borrowed: Decimal = Decimal(0)
    borrowing_limit: Decimal | None = None

    def text(self) -> str:
        q = format_quantity
        words = f"{q(self.used)} of {q(self.total)} nominal admitted"
        if self.borrowed:
            words += f", {q(self.borrowed)} borrowed"
        if self.borrowing_limit is not None:
            words += f" (may borrow up to {q(self.borrowing_limit)})"
        return words


@dataclass(frozen=True)
class QueueCard:
    name: str
    bars: list[QueueBar]  # the GPU resources, per flavor
    others: list[str]  # the other resources in words: "cpu 2 of 100"


def _amount(value: str | None) -> Decimal | None:
    if value is None:
        return None
    try:
        return parse_quantity(value)
    except QuantityError:
        return None


def queue_cards(queues: Iterable[Any]) -> dict[str, QueueCard]:
    """Per ClusterQueue (api/queues.py's ClusterQueueView), its GPUs as bars per flavor
    and the rest of its quota in words."""
    cards = {}
    for queue in queues:
        bars, others = [], []
        for line in queue.resources:
            reserved = _amount(line.reserved) or Decimal(0)
            nominal = _amount(line.nominal)
            if is_gpu_resource(line.resource) and nominal is not None:
                bars.append(
                    QueueBar(
                        f"{line.flavor} · {line.resource}",
                        reserved,
                        nominal,
                        borrowed=_amount(line.borrowed) or Decimal(0),
                        borrowing_limit=_amount(line.borrowing_limit),
                    )
                )
            else:
                others.append(f"{line.resource} ({line.flavor}) {line.reserved} of {line.nominal}")
        cards[queue.name] = QueueCard(queue.name, bars, others)
    return cards


# -- GPU usage ---------------------------------------------------------------------


@dataclass(frozen=True)
class UsageBar:
    """One project and GPU type's GPU-hours, split before training / training, drawn
    to the scale of the largest row (SVG units 0..100)."""

    project: str
    gpu_type: str
    jobs: int
    before_hours: float
    training_hours: float
    before_width: float
    training_width: float

    @property
    def total_hours(self) -> float:
        return self.before_hours + self.training_hours

    @property
    def training_share(self) -> str:
        total = self.total_hours
        return f"{self.training_hours / total:.0%}" if total else "-"


def usage_bars(items: Iterable[Any]) -> list[UsageBar]:
    """The usage answer's rows (api/usage.py's UsageEntry) as bars, largest first."""
    rows = [(i, i.before_training / 3600, i.training / 3600) for i in items]
    widest = max((before + training for _, before, training in rows), default=0.0) or 1.0
    bars = [
        UsageBar(
            project=item.project,
            gpu_type=item.gpu_type,
            jobs=item.jobs,
            before_hours=before,
            training_hours=training,
            before_width=round(before / widest * 100, 2),
            training_width=round(training / widest * 100, 2),
        )
        for item, before, training in rows
    ]
    return sorted(bars, key=lambda b: (-b.total_hours, b.project, b.gpu_type))
