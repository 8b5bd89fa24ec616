"""A proxy-wasm host stand-in (ABI 0.2.1) on wasmtime, for counting what a module does.

One `Process` is one Envoy: the shared data of one `vm_id` (values with Envoy's versions and
compare-and-swap), stats by name (counters, gauges, histograms), the two clocks (`proxy_get_current_time_nanoseconds`,
the wall clock; WASI `clock_time_get`, wall or monotonic), the clusters an HTTP call may name, and the log. Each
`Vm` is one worker's (or the main thread's) instance of the module, with its own memory, its contexts (roots,
HTTP streams, connections) and the callbacks Envoy makes into it. Time moves only when the caller moves it, so
the same calls always make the same run.

The host implements the calls the module imports, and refuses a module importing one it does not know (by
name): a new import is a new cost, and has to be implemented here before it can be counted. Every call into
the host is counted by its import name; wasmtime's fuel (about one unit per wasm operator executed) counts the
instructions, the module's own allocations for what the host hands it (`proxy_on_memory_allocate`) included, as
Envoy makes the module pay them too.
"""
from __future__ import annotations

import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import wasmtime

# proxy-wasm statuses (ABI 0.2.1).
OK, NOT_FOUND, BAD_ARGUMENT, EMPTY, CAS_MISMATCH, INTERNAL_FAILURE = 0, 1, 2, 7, 8, 10
# Map types.
REQUEST_HEADERS, REQUEST_TRAILERS, RESPONSE_HEADERS, RESPONSE_TRAILERS = 0, 1, 2, 3
HTTP_CALL_RESPONSE_HEADERS, HTTP_CALL_RESPONSE_TRAILERS = 6, 7
# Buffer types.
HTTP_CALL_RESPONSE_BODY, VM_CONFIGURATION, PLUGIN_CONFIGURATION = 4, 6, 7
# Metric types.
COUNTER, GAUGE, HISTOGRAM = 0, 1, 2
# Peer types of a connection's close.
PEER_UNKNOWN, PEER_LOCAL, PEER_REMOTE = 0, 1, 2
FUEL = 1 << 62
U64 = (1 << 64) - 1


class HostError(RuntimeError):
    """The module did something a proxy-wasm host refuses, or the stand-in cannot serve."""


def _pairs(blob: bytes) -> list[tuple[bytes, bytes]]:
    """A header map as the ABI serializes it: count, sizes, then NUL-terminated names and values."""
    (n,) = struct.unpack_from("<I", blob, 0)
    sizes = struct.unpack_from(f"<{2 * n}I", blob, 4)
    pos, out = 4 + 8 * n, []
    for i in range(n):
        k, v = sizes[2 * i], sizes[2 * i + 1]
        out.append((bytes(blob[pos:pos + k]), bytes(blob[pos + k + 1:pos + k + 1 + v])))
        pos += k + v + 2
    return out


def serialize_pairs(pairs: list[tuple[bytes, bytes]]) -> bytes:
    head = struct.pack("<I", len(pairs)) + b"".join(struct.pack("<II", len(k), len(v)) for k, v in pairs)
    return head + b"".join(k + b"\0" + v + b"\0" for k, v in pairs)


@dataclass
class Stat:
    kind: int
    value: int = 0
    samples: list[int] = field(default_factory=list)


@dataclass
class Answer:
    """A local reply a context sent (`proxy_send_local_response`)."""
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes


@dataclass
class Call:
    """An HTTP call a context dispatched (`proxy_http_call`), not yet answered."""
    vm: "Vm"
    context_id: int
    token: int
    cluster: str
    headers: list[tuple[bytes, bytes]]


@dataclass
class Context:
    id: int
    root_id: int  # 0: a root context
    kind: str  # "root", "http" or "stream"
    plugin: str = ""
    maps: dict[int, list[tuple[bytes, bytes]]] = field(default_factory=dict)
    properties: dict[str, bytes] = field(default_factory=dict)
    answers: list[Answer] = field(default_factory=list)
    tick_ms: int = 0


class Process:
    """One Envoy: what every VM of one `vm_id` shares."""

    def __init__(self, wall_ms: int = 1_764_000_000_000, mono_ms: int = 1_000,
                 clusters: tuple[str, ...] = ()):
        self.wall_ns = wall_ms * 1_000_000
        self.mono_ns = mono_ms * 1_000_000
        self.shared: dict[bytes, tuple[bytes, int]] = {}
        self.next_cas = 1
        self.queues: dict[bytes, int] = {}
        self.queue_data: dict[int, list[bytes]] = {}
        self.stats: dict[bytes, Stat] = {}
        self.clusters = set(clusters)
        self.calls: list[Call] = []
        self.logs: list[tuple[int, str]] = []
        self.vms: list[Vm] = []
        # What a measurement is counting (None: nothing).
        self.meter: Meter | None = None

    def advance(self, ms: int) -> None:
        """Both clocks move on by `ms`."""
        self.wall_ns += ms * 1_000_000
        self.mono_ns += ms * 1_000_000

    def cas(self) -> int:
        """Envoy's next version: one counter for every key, never 0."""
        c = self.next_cas
        self.next_cas = (self.next_cas + 1) & 0xFFFFFFFF or 1
        return c

    def stat(self, name: str) -> int:
        s = self.stats.get(name.encode())
        return s.value if s else 0

    def count(self, name: str) -> None:
        if self.meter is not None:
            self.meter.calls[name] += 1


class Meter:
    """What the callbacks made while it was open: fuel and host calls by name."""

    def __init__(self, timeline: bool = False):
        self.fuel = 0
        self.calls: Counter[str] = Counter()
        # With `timeline`: (event, instructions since the previous event) — each host call, each callback's
        # entry (`> name`) and return (`< name`).
        self.timeline: list[tuple[str, int]] | None = [] if timeline else None
        self._last: dict[int, int] = {}

    def mark(self, vm: "Vm", event: str) -> None:
        if self.timeline is None:
            return
        fuel = vm.store.get_fuel()
        self.timeline.append((f"{vm.name} {event}", self._last.get(id(vm), fuel) - fuel))
        self._last[id(vm)] = fuel

    @property
    def host_calls(self) -> int:
        return sum(self.calls.values())


class Module:
    """A compiled module, and the check that this host implements every call it imports."""

    def __init__(self, path: Path):
        config = wasmtime.Config()
        config.consume_fuel = True
        self.engine = wasmtime.Engine(config)
        self.path = Path(path)
        self.module = wasmtime.Module.from_file(self.engine, str(path))
        missing = [f"{i.module}.{i.name}" for i in self.module.imports if i.name not in HOST_CALLS]
        if missing:
            raise HostError(f"{self.path.name} imports calls this host does not implement: {', '.join(missing)}")
        self.imports = sorted(f"{i.module}.{i.name}" for i in self.module.imports)
        self.exports = {e.name for e in self.module.exports}


HOST_CALLS: dict[str, Callable] = {}


def hostcall(fn: Callable) -> Callable:
    HOST_CALLS[fn.__name__] = fn
    return fn


class Vm:
    """One instance of the module (one worker's VM, or the main thread's), in `process`."""

    def __init__(self, process: Process, module: Module, name: str):
        self.process, self.module, self.name = process, module, name
        self.store = wasmtime.Store(module.engine)
        self.store.set_fuel(FUEL)
        linker = wasmtime.Linker(module.engine)
        for imp in module.module.imports:
            impl = HOST_CALLS[imp.name]
            linker.define_func(imp.module, imp.name, imp.type, self._bind(imp.name, impl))
        self.instance = linker.instantiate(self.store, module.module)
        ex = self.instance.exports(self.store)
        self.memory: wasmtime.Memory = ex["memory"]
        self.exports = {name: ex[name] for name in module.exports if name != "memory"}
        self.contexts: dict[int, Context] = {}
        self.next_id = 1
        self.current: Context | None = None
        self.roots: dict[str, int] = {}
        self.last_token = 0
        self.depth = 0
        process.vms.append(self)
        if "_initialize" in self.exports:
            self._call("_initialize")

    # --- plumbing -------------------------------------------------------------------------------
    def _bind(self, name: str, impl: Callable) -> Callable:
        def call(*args):
            self.process.count(name)
            if self.process.meter is not None:
                ev = name
                if name in ("proxy_get_shared_data", "proxy_set_shared_data"):
                    ev = f"{name} {self.read(args[0], args[1]).decode()}"
                self.process.meter.mark(self, ev)
            return impl(self, *args)
        return call

    def _call(self, export: str, *args, context: Context | None = None):
        fn = self.exports.get(export)
        if fn is None:
            return None  # Envoy skips a callback the module does not export
        before_ctx, self.current = self.current, context
        outer = self.depth == 0
        self.depth += 1
        meter = self.process.meter
        if meter is not None:
            meter._last[id(self)] = self.store.get_fuel() if outer else meter._last.get(id(self), 0)
            meter.mark(self, f"> {export}")
        before = self.store.get_fuel()
        try:
            return fn(self.store, *args)
        finally:
            if meter is not None:
                meter.mark(self, f"< {export}")
            self.depth -= 1
            # The module's allocation for a host call runs inside the callback: counted with it, once.
            if outer and self.process.meter is not None:
                self.process.meter.fuel += before - self.store.get_fuel()
            self.current = before_ctx

    def read(self, ptr: int, size: int) -> bytes:
        ptr &= 0xFFFFFFFF
        if size == 0:
            return b""
        return bytes(self.memory.read(self.store, ptr, ptr + size))

    def write(self, ptr: int, data: bytes) -> None:
        self.memory.write(self.store, data, ptr & 0xFFFFFFFF)

    def give(self, data: bytes, ptr_ptr: int, size_ptr: int) -> int:
        """Hands the module a copy of `data` in memory it allocates itself, as Envoy does."""
        addr = 0
        if data:
            addr = self._call("proxy_on_memory_allocate", len(data), context=self.current)
            if not addr:
                raise HostError("proxy_on_memory_allocate returned 0")
            self.write(addr, data)
        self.write(ptr_ptr, struct.pack("<I", addr & 0xFFFFFFFF))
        self.write(size_ptr, struct.pack("<I", len(data)))
        return OK

    def ctx(self) -> Context:
        if self.current is None:
            raise HostError("a host call with no context running")
        return self.current

    def _new(self, kind: str, root_id: int, plugin: str = "") -> Context:
        c = Context(self.next_id, root_id, kind, plugin)
        self.next_id += 1
        self.contexts[c.id] = c
        return c

    # --- what Envoy does --------------------------------------------------------------------------
    def start(self, plugin: str, configuration: bytes) -> int:
        """A plugin's root context: created, started, configured (Envoy's order)."""
        root = self._new("root", 0, plugin)
        root.properties["plugin_configuration"] = configuration
        self._call("proxy_on_context_create", root.id, 0, context=root)
        self._call("proxy_on_vm_start", root.id, 0, context=root)
        if not self._call("proxy_on_configure", root.id, len(configuration), context=root):
            raise HostError(f"{self.name}: {plugin} refused its configuration: {self.last_logs()}")
        self.roots[plugin] = root.id
        return root.id

    def tick(self, plugin: str) -> None:
        root = self.contexts[self.roots[plugin]]
        if root.tick_ms:
            self._call("proxy_on_tick", root.id, context=root)

    def http(self, plugin: str, headers: list[tuple[str, str]], properties: dict[str, bytes] | None = None) -> Context:
        """An HTTP stream reaches the filter (its context is created in decodeHeaders)."""
        c = self._new("http", self.roots[plugin])
        c.properties = {"request.protocol": b"HTTP/1.1", "source.address": b"127.0.0.1:40000", **(properties or {})}
        c.maps[REQUEST_HEADERS] = [(k.encode(), v.encode()) for k, v in headers]
        self._call("proxy_on_context_create", c.id, c.root_id, context=c)
        return c

    def request_headers(self, c: Context, end_of_stream: bool = True) -> int:
        return self._call("proxy_on_request_headers", c.id, len(c.maps[REQUEST_HEADERS]), int(end_of_stream), context=c)

    def response_headers(self, c: Context, end_of_stream: bool = False, headers=((":status", "200"),)) -> int:
        c.maps[RESPONSE_HEADERS] = [(k.encode(), v.encode()) for k, v in headers]
        return self._call("proxy_on_response_headers", c.id, len(c.maps[RESPONSE_HEADERS]), int(end_of_stream),
                          context=c)

    def response_body(self, c: Context, size: int, end_of_stream: bool) -> int:
        return self._call("proxy_on_response_body", c.id, size, int(end_of_stream), context=c)

    def connection(self, plugin: str) -> Context:
        """A downstream connection reaches a network filter."""
        c = self._new("stream", self.roots[plugin])
        c.properties = {"source.address": b"127.0.0.1:40000"}
        self._call("proxy_on_context_create", c.id, c.root_id, context=c)
        return c

    def downstream_data(self, c: Context, size: int, end_of_stream: bool) -> int:
        return self._call("proxy_on_downstream_data", c.id, size, int(end_of_stream), context=c)

    def upstream_data(self, c: Context, size: int, end_of_stream: bool) -> int:
        return self._call("proxy_on_upstream_data", c.id, size, int(end_of_stream), context=c)

    def downstream_close(self, c: Context, peer: int) -> None:
        self._call("proxy_on_downstream_connection_close", c.id, peer, context=c)

    def upstream_close(self, c: Context, peer: int) -> None:
        self._call("proxy_on_upstream_connection_close", c.id, peer, context=c)

    def end(self, c: Context) -> None:
        """The stream or connection is over: done, its log, deleted (Envoy's order)."""
        self._call("proxy_on_done", c.id, context=c)
        self._call("proxy_on_log", c.id, context=c)
        self._call("proxy_on_delete", c.id, context=c)
        del self.contexts[c.id]

    def answer_call(self, call: Call, status: int | None) -> None:
        """Delivers the answer to an HTTP call (`None`: it failed, no headers)."""
        root = self.contexts[call.context_id]
        headers = [] if status is None else [(b":status", str(status).encode())]
        root.maps[HTTP_CALL_RESPONSE_HEADERS] = headers
        self._call("proxy_on_http_call_response", root.id, call.token, len(headers), 0, 0, context=root)
        root.maps.pop(HTTP_CALL_RESPONSE_HEADERS, None)

    def last_logs(self, n: int = 3) -> str:
        return " | ".join(m for _, m in self.process.logs[-n:])


# --- the calls (each gets the Vm first, then the module's arguments) ------------------------------
@hostcall
def proxy_log(vm: Vm, level, ptr, size):
    vm.process.logs.append((level, vm.read(ptr, size).decode("utf-8", "replace")))
    return OK


@hostcall
def proxy_get_current_time_nanoseconds(vm: Vm, ret):
    vm.write(ret, struct.pack("<Q", vm.process.wall_ns))
    return OK


@hostcall
def clock_time_get(vm: Vm, clock_id, _precision, ret):
    if clock_id not in (0, 1):
        return 28  # WASI EINVAL
    vm.write(ret, struct.pack("<Q", vm.process.wall_ns if clock_id == 0 else vm.process.mono_ns))
    return 0


@hostcall
def proxy_set_tick_period_milliseconds(vm: Vm, ms):
    vm.ctx().tick_ms = ms & 0xFFFFFFFF
    return OK


@hostcall
def proxy_get_buffer_bytes(vm: Vm, kind, start, max_size, ret_ptr, ret_size):
    c = vm.ctx()
    root = c if c.kind == "root" else vm.contexts[c.root_id]
    if kind == PLUGIN_CONFIGURATION:
        data = root.properties["plugin_configuration"]
    elif kind == VM_CONFIGURATION:
        data = b""
    elif kind == HTTP_CALL_RESPONSE_BODY:
        data = b""
    else:
        return NOT_FOUND
    start &= 0xFFFFFFFF
    if start > len(data):
        return BAD_ARGUMENT
    return vm.give(data[start:start + (max_size & 0xFFFFFFFF)], ret_ptr, ret_size)


@hostcall
def proxy_set_buffer_bytes(vm: Vm, _kind, _start, _size, _ptr, _len):
    return BAD_ARGUMENT  # no buffer here is writable


def _map(vm: Vm, kind: int) -> list[tuple[bytes, bytes]] | None:
    return vm.ctx().maps.get(kind)


@hostcall
def proxy_get_header_map_value(vm: Vm, kind, key_ptr, key_size, ret_ptr, ret_size):
    key = vm.read(key_ptr, key_size).lower()
    for k, v in _map(vm, kind) or []:
        if k == key:
            return vm.give(v, ret_ptr, ret_size)
    return NOT_FOUND


@hostcall
def proxy_get_header_map_pairs(vm: Vm, kind, ret_ptr, ret_size):
    return vm.give(serialize_pairs(_map(vm, kind) or []), ret_ptr, ret_size)


@hostcall
def proxy_set_header_map_pairs(vm: Vm, kind, ptr, size):
    vm.ctx().maps[kind] = _pairs(vm.read(ptr, size))
    return OK


@hostcall
def proxy_add_header_map_value(vm: Vm, kind, kp, ks, vp, vs):
    vm.ctx().maps.setdefault(kind, []).append((vm.read(kp, ks).lower(), vm.read(vp, vs)))
    return OK


@hostcall
def proxy_replace_header_map_value(vm: Vm, kind, kp, ks, vp, vs):
    key, value = vm.read(kp, ks).lower(), vm.read(vp, vs)
    m = [(k, v) for k, v in vm.ctx().maps.get(kind, []) if k != key]
    vm.ctx().maps[kind] = m + [(key, value)]
    return OK


@hostcall
def proxy_remove_header_map_value(vm: Vm, kind, kp, ks):
    key = vm.read(kp, ks).lower()
    vm.ctx().maps[kind] = [(k, v) for k, v in vm.ctx().maps.get(kind, []) if k != key]
    return OK


@hostcall
def proxy_get_property(vm: Vm, path_ptr, path_size, ret_ptr, ret_size):
    path = vm.read(path_ptr, path_size).replace(b"\0", b".").decode()
    value = vm.ctx().properties.get(path)
    if value is None or path == "plugin_configuration":
        return NOT_FOUND
    return vm.give(value, ret_ptr, ret_size)


@hostcall
def proxy_set_property(vm: Vm, path_ptr, path_size, vp, vs):
    path = vm.read(path_ptr, path_size).replace(b"\0", b".").decode()
    vm.ctx().properties[path] = vm.read(vp, vs)
    return OK


@hostcall
def proxy_get_shared_data(vm: Vm, kp, ks, ret_ptr, ret_size, ret_cas):
    entry = vm.process.shared.get(vm.read(kp, ks))
    if entry is None:
        return NOT_FOUND
    value, cas = entry
    vm.write(ret_cas, struct.pack("<I", cas))
    return vm.give(value, ret_ptr, ret_size)


@hostcall
def proxy_set_shared_data(vm: Vm, kp, ks, vp, vs, cas):
    key, cas = vm.read(kp, ks), cas & 0xFFFFFFFF
    current = vm.process.shared.get(key)
    if current is not None and cas and cas != current[1]:
        return CAS_MISMATCH
    vm.process.shared[key] = (vm.read(vp, vs), vm.process.cas())
    return OK


@hostcall
def proxy_register_shared_queue(vm: Vm, np, ns, ret_id):
    name = vm.read(np, ns)
    qid = vm.process.queues.setdefault(name, len(vm.process.queues) + 1)
    vm.process.queue_data.setdefault(qid, [])
    vm.write(ret_id, struct.pack("<I", qid))
    return OK


@hostcall
def proxy_dequeue_shared_queue(vm: Vm, qid, ret_ptr, ret_size):
    q = vm.process.queue_data.get(qid & 0xFFFFFFFF)
    if q is None:
        return NOT_FOUND
    if not q:
        return EMPTY
    return vm.give(q.pop(0), ret_ptr, ret_size)


# The calls below are imported by the cargo-built fixtures the calibration counts (tests/bench/noop, twin,
# bisect), not by the shipped module: wasm-opt drops them with the callbacks that used them.
@hostcall
def proxy_resolve_shared_queue(vm: Vm, _vp, _vs, np, ns, ret_id):
    qid = vm.process.queues.get(vm.read(np, ns))
    if qid is None:
        return NOT_FOUND
    vm.write(ret_id, struct.pack("<I", qid))
    return OK


@hostcall
def proxy_enqueue_shared_queue(vm: Vm, qid, vp, vs):
    q = vm.process.queue_data.get(qid & 0xFFFFFFFF)
    if q is None:
        return NOT_FOUND
    q.append(vm.read(vp, vs))
    return OK


@hostcall
def proxy_define_metric(vm: Vm, kind, np, ns, ret_id):
    if kind not in (COUNTER, GAUGE, HISTOGRAM):
        return BAD_ARGUMENT
    name = vm.read(np, ns)
    stat = vm.process.stats.setdefault(name, Stat(kind))
    if stat.kind != kind:
        return BAD_ARGUMENT
    ids = vm.__dict__.setdefault("metric_ids", [])
    ids.append(name)
    vm.write(ret_id, struct.pack("<I", len(ids)))  # ids start at 1, per VM, as Envoy's do
    return OK


def _stat(vm: Vm, mid: int) -> Stat | None:
    ids = vm.__dict__.get("metric_ids", [])
    mid &= 0xFFFFFFFF
    if not 1 <= mid <= len(ids):
        return None
    return vm.process.stats[ids[mid - 1]]


@hostcall
def proxy_increment_metric(vm: Vm, mid, offset):
    s = _stat(vm, mid)
    if s is None:
        return NOT_FOUND
    if s.kind == HISTOGRAM or (s.kind == COUNTER and offset < 0):
        return BAD_ARGUMENT
    s.value = (s.value + offset) & U64  # Envoy's stats are u64: below 0 wraps
    return OK


@hostcall
def proxy_record_metric(vm: Vm, mid, value):
    s = _stat(vm, mid)
    if s is None:
        return NOT_FOUND
    value &= U64
    if s.kind == COUNTER:
        s.value = (s.value + value) & U64
    elif s.kind == GAUGE:
        s.value = value
    else:
        s.samples.append(value)
    return OK


@hostcall
def proxy_get_metric(vm: Vm, mid, ret):
    s = _stat(vm, mid)
    if s is None:
        return NOT_FOUND
    if s.kind == HISTOGRAM:
        return BAD_ARGUMENT
    vm.write(ret, struct.pack("<Q", s.value))
    return OK


@hostcall
def proxy_http_call(vm: Vm, up, us, hp, hs, _bp, _bs, _tp, _ts, _timeout, ret_token):
    cluster = vm.read(up, us).decode()
    if cluster not in vm.process.clusters:
        return BAD_ARGUMENT  # Envoy: no such cluster
    vm.last_token += 1
    vm.process.calls.append(Call(vm, vm.ctx().id, vm.last_token, cluster, _pairs(vm.read(hp, hs))))
    vm.write(ret_token, struct.pack("<I", vm.last_token))
    return OK


@hostcall
def proxy_send_local_response(vm: Vm, status, _dp, _ds, bp, bs, hp, hs, _grpc):
    c = vm.ctx()
    if c.kind != "http":
        return BAD_ARGUMENT
    c.answers.append(Answer(status, _pairs(vm.read(hp, hs)) if hs else [], vm.read(bp, bs)))
    return OK


@hostcall
def proxy_set_effective_context(vm: Vm, cid):
    c = vm.contexts.get(cid & 0xFFFFFFFF)
    if c is None:
        return BAD_ARGUMENT
    vm.current = c
    return OK


def answers(status: int, *names: str) -> None:
    """Calls that only answer `status`: what Envoy answers a module that asks for nothing here."""
    for name in names:
        HOST_CALLS[name] = lambda vm, *args, _status=status: _status


# A stream resumed or closed by the module (never, on the paths measured), and the call that ends a VM's
# shutdown: done.
answers(OK, "proxy_continue_stream", "proxy_close_stream", "proxy_done")
# No gRPC stream is ever open and no foreign function registered; no gRPC service exists (the last two are
# imported by the cargo-built fixtures only).
answers(NOT_FOUND, "proxy_grpc_send", "proxy_grpc_cancel", "proxy_grpc_close", "proxy_call_foreign_function")
answers(INTERNAL_FAILURE, "proxy_grpc_call", "proxy_grpc_stream")


@hostcall
def proxy_get_status(vm: Vm, ret_code, ret_ptr, ret_size):
    vm.write(ret_code, struct.pack("<I", 0))
    return vm.give(b"", ret_ptr, ret_size)


@hostcall
def environ_sizes_get(vm: Vm, count_ptr, size_ptr):
    vm.write(count_ptr, struct.pack("<I", 0))
    vm.write(size_ptr, struct.pack("<I", 0))
    return 0


@hostcall
def environ_get(vm: Vm, _environ, _buf):
    return 0


@hostcall
def fd_write(vm: Vm, fd, iovs, iovs_len, ret_written):
    total = 0
    for i in range(iovs_len):
        ptr, size = struct.unpack("<II", vm.read(iovs + 8 * i, 8))
        vm.process.logs.append((-fd, vm.read(ptr, size).decode("utf-8", "replace")))
        total += size
    vm.write(ret_written, struct.pack("<I", total))
    return 0


@hostcall
def proc_exit(vm: Vm, code):
    raise HostError(f"{vm.name}: the module called proc_exit({code})")
