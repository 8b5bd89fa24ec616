"""Front LBs other than HAProxy, run from the shipped files of envoyfilter/lb/ as written:
a real Envoy (`envoy-front.yaml`) and Debian's nginx (`nginx-drain-gate.conf`), in front
of one or more gateways on loopback. Only addresses, ports and (Envoy) the check interval
are set here; nginx's file goes into a minimal nginx.conf, as Debian includes conf.d/.
The recipes before them, kept as the tests' controls (tests/lb/controls/), run the same way.

Each one reads back, from its own access log, what it did with every request: the
gateway that answered last, how many tries it took (2 or more: resent) and the status.
"""
from __future__ import annotations

import copy
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import requests
import yaml

from tests.harness.envoy import REPO, envoy_binary, free_port
from tests.harness.process import Child, accepts, wait_for

LB_DIR = REPO / "envoyfilter" / "lb"
ENVOY_FRONT = LB_DIR / "envoy-front.yaml"
NGINX_CONF = LB_DIR / "nginx-drain-gate.conf"
CONTROLS = REPO / "tests" / "lb" / "controls"
# The recipes before: Envoy resent every 503 (`retriable_status_codes: [503]`), nginx every
# request that failed after it was sent, POST included (`non_idempotent`, `max_fails=1`).
ENVOY_FRONT_CONTROL = CONTROLS / "envoy-front-resends-503.yaml"
NGINX_CONTROL = CONTROLS / "nginx-non-idempotent.conf"


@dataclass
class Served:
    """One request as the front LB logged it."""

    path: str
    method: str
    status: int
    tries: int  # upstream attempts: 2 or more means the LB resent it
    server: str | None  # the gateway that answered last (by name), None when none did
    servers: list[str]  # every gateway tried, in order (nginx); the last one otherwise

    @property
    def resent(self) -> bool:
        return self.tries >= 2


class EnvoyFront(Child):
    """envoyfilter/lb/envoy-front.yaml (or `recipe`: a control) in a real Envoy. `gateways`:
    [(name, traffic port, check port)].

    `retry`: "shipped" (the file's retry_policy as written) or "none" (no retry_policy at all)."""

    name = "envoy front LB"

    def __init__(self, workdir: Path, gateways: list[tuple[str, int, int]], *, inter_s: float = 2.0,
                 retry: str = "shipped", recipe: Path = ENVOY_FRONT):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.gateways = gateways
        self.port = free_port()
        self.admin_port = free_port()
        self.doc = render_envoy_front(gateways, self.port, self.admin_port, inter_s=inter_s, retry=retry, recipe=recipe)
        self.config_path = self.workdir / "envoy-front.yaml"
        super().__init__(self.workdir / "envoy-front.log")

    def start(self, timeout: float = 60) -> "EnvoyFront":
        self.config_path.write_text(yaml.safe_dump(self.doc, sort_keys=False))
        # The access log is the rig's evidence: written out every 100 ms, not Envoy's default 10 s.
        self.spawn([envoy_binary(), "-c", str(self.config_path), "--concurrency", "1", "--use-dynamic-base-id",
                    "--log-level", "info", "--file-flush-interval-msec", "100"])
        self.wait_until(lambda: accepts(self.port) and self._admin("/ready").status_code == 200, timeout,
                        "envoy front LB ready")
        return self

    def _admin(self, path: str) -> requests.Response:
        try:
            return requests.get(f"http://127.0.0.1:{self.admin_port}{path}", timeout=2)
        except requests.RequestException:
            r = requests.Response()
            r.status_code = 0
            return r

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def host_status(self) -> dict[str, str]:
        """UP or DOWN per gateway, as the active health check has it (/clusters)."""
        by_port = {traffic: name for name, traffic, _ in self.gateways}
        out = {}
        for line in self._admin("/clusters").text.splitlines():
            m = re.match(r"gateways::127\.0\.0\.1:(\d+)::health_flags::(.*)$", line)
            if m and int(m[1]) in by_port:
                out[by_port[int(m[1])]] = "UP" if m[2].strip() == "healthy" else "DOWN"
        return out

    def wait_status(self, name: str, want: str, timeout: float) -> str:
        return wait_for(lambda: self.host_status().get(name) == want and want, timeout, 0.05,
                        f"envoy front LB: {name} {want}")

    def stat(self, name: str) -> int:
        for line in self._admin(f"/stats?filter=^{re.escape(name)}$").text.splitlines():
            key, _, value = line.partition(": ")
            if key == name:
                return int(value)
        return 0

    def served(self) -> list[Served]:
        by_addr = {f"127.0.0.1:{traffic}": name for name, traffic, _ in self.gateways}
        out = []
        for m in re.finditer(r'^front \S+ "(\S+) (\S+)" (\d+) \S+ upstream=(\S+) attempts=(\d+)', self.log(), re.M):
            server = by_addr.get(m[4])
            out.append(Served(path=m[2], method=m[1], status=int(m[3]), tries=int(m[5]), server=server,
                              servers=[server] if server else []))
        return out


def render_envoy_front(gateways: list[tuple[str, int, int]], port: int, admin_port: int, *, inter_s: float,
                       retry: str, recipe: Path = ENVOY_FRONT) -> dict:
    doc = copy.deepcopy(yaml.safe_load(recipe.read_text()))
    doc["admin"]["address"]["socket_address"]["port_value"] = admin_port
    (listener,) = doc["static_resources"]["listeners"]
    listener["address"]["socket_address"] = {"address": "127.0.0.1", "port_value": port}
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    route = hcm["route_config"]["virtual_hosts"][0]["routes"][0]["route"]
    if retry == "none":
        del route["retry_policy"]
    elif retry != "shipped":
        raise ValueError(retry)
    (cluster,) = doc["static_resources"]["clusters"]
    template = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]
    endpoints = []
    for _, traffic, check in gateways:
        e = copy.deepcopy(template)
        e["endpoint"]["address"]["socket_address"] = {"address": "127.0.0.1", "port_value": traffic}
        e["endpoint"]["health_check_config"]["port_value"] = check
        endpoints.append(e)
    cluster["load_assignment"]["endpoints"][0]["lb_endpoints"] = endpoints
    (hc,) = cluster["health_checks"]
    hc["interval"] = hc["no_traffic_interval"] = f"{inter_s:g}s"
    return doc


class Nginx(Child):
    """envoyfilter/lb/nginx-drain-gate.conf (or `recipe`: a control) in Debian's nginx, included in
    a minimal nginx.conf (pid, logs and temp paths in `workdir`). `next_upstream` replaces
    `proxy_next_upstream`'s conditions (NGINX_503: what the recipe had before that)."""

    name = "nginx"

    def __init__(self, workdir: Path, gateways: list[tuple[str, int]], *, recipe: Path = NGINX_CONF,
                 next_upstream: str | None = None):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.gateways = gateways
        self.port = free_port()
        self.grpc_port = free_port()
        self.conf_d = self.workdir / "drain-gate.conf"
        self.conf_d.write_text(render_nginx_conf(gateways, self.port, self.grpc_port, recipe=recipe,
                                                 next_upstream=next_upstream))
        self.access_log = self.workdir / "access.log"
        self.main_conf = self.workdir / "nginx.conf"
        temps = "\n".join(f"    {k}_temp_path {self.workdir / k};" for k in ("client_body", "proxy", "fastcgi",
                                                                             "uwsgi", "scgi"))
        # As root, nginx's workers would run as nobody, who cannot reach a private workdir.
        user = "user root root;\n" if os.geteuid() == 0 else ""
        self.main_conf.write_text(
            f"{user}worker_processes 1;\npid {self.workdir / 'nginx.pid'};\n"
            f"error_log {self.workdir / 'error.log'} info;\nevents {{ worker_connections 1024; }}\n"
            "http {\n"
            "    log_format front '$msec \"$request_method $request_uri\" $status "
            "upstream=\"$upstream_addr\" statuses=\"$upstream_status\"';\n"
            f"    access_log {self.access_log} front;\n{temps}\n"
            f"    include {self.conf_d};\n}}\n")
        super().__init__(self.workdir / "nginx.log")

    def check_config(self) -> None:
        r = subprocess.run(self._argv("-t"), capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"nginx -t failed:\n{r.stdout}{r.stderr}")

    def _argv(self, *extra: str) -> list[str]:
        return ["nginx", "-e", str(self.workdir / "error.log"), "-p", str(self.workdir), "-c", str(self.main_conf),
                *extra]

    def start(self, timeout: float = 15) -> "Nginx":
        self.check_config()
        self.spawn(self._argv("-g", "daemon off;"))
        self.wait_until(lambda: accepts(self.port), timeout, "nginx listening")
        return self

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def served(self) -> list[Served]:
        by_addr = {f"127.0.0.1:{traffic}": name for name, traffic in self.gateways}
        try:
            text = self.access_log.read_text(errors="replace")
        except FileNotFoundError:
            return []
        out = []
        for m in re.finditer(r'^\S+ "(\S+) (\S+)" (\d+) upstream="([^"]*)" statuses="([^"]*)"', text, re.M):
            # "$upstream_addr": every gateway tried, "a, b" (or "a : b" across upstream groups).
            tried = [by_addr.get(x, x) for x in re.findall(r"127\.0\.0\.1:\d+", m[4])]
            out.append(Served(path=m[2], method=m[1], status=int(m[3]), tries=len(tried),
                              server=tried[-1] if tried else None, servers=tried))
        return out


# The conditions of the recipe's `proxy_next_upstream` before it moved to drain-gate's reset:
# every 503 resent, and counted a failure of its gateway.
NGINX_503 = "error timeout http_503 non_idempotent"


def render_nginx_conf(gateways: list[tuple[str, int]], port: int, grpc_port: int, *, recipe: Path = NGINX_CONF,
                      next_upstream: str | None = None) -> str:
    """The shipped file (or `recipe`) with one `server` line per gateway (options copied from the
    first one), `listen` on 127.0.0.1:`port` and, for gRPC, 127.0.0.1:`grpc_port`."""
    out, seen = [], set()
    for line in recipe.read_text().splitlines():
        s = line.strip()
        m = re.match(r"server 203\.0\.113\.\d+:30080( .*);$", s)
        if m:
            if "server" not in seen:
                indent = line[: len(line) - len(line.lstrip())]
                out += [f"{indent}server 127.0.0.1:{traffic}{m[1]};" for _, traffic in gateways]
                seen.add("server")
            continue
        if s == "listen 80;":
            line = line.replace("listen 80;", f"listen 127.0.0.1:{port};")
            seen.add("listen")
        if s == "listen 50051 http2;":
            line = line.replace("listen 50051", f"listen 127.0.0.1:{grpc_port}")
            seen.add("listen grpc")
        if s.startswith("proxy_next_upstream "):
            if next_upstream:
                line = line.replace(s, f"proxy_next_upstream {next_upstream};")
            seen.add("next")
        out.append(line)
    if not {"server", "listen", "listen grpc", "next"} <= seen:
        raise ValueError(f"{recipe}: expected lines not found (found {sorted(seen)})")
    return "\n".join(out) + "\n"
