"""The LB recipes not run here (envoyfilter/netscaler, f5, aws, gcp): nothing here runs a
NetScaler, a BIG-IP, an AWS NLB or a Google Cloud LB (tools/prove.py is how an operator runs one,
tests/lb/test_prove.py). What is checked is that each file parses, checks drain-gate's
`/health_check.html` on the check NodePort and sends traffic to the traffic NodePorts of
envoyfilter/kubernetes/service.yaml, that its check timings give the detection window, `lb_fall`
and an `lb_buffer` above the window that envoyfilter/docs/lb.md states, and that every NetScaler
and BIG-IP command cites its vendor's documentation: a port, path or timing changed in one place
fails here."""
from __future__ import annotations

import json
import re

import pytest
import yaml

from tests.harness import istio

ENVOYFILTER = istio.ENVOYFILTER
README = ENVOYFILTER / "docs" / "lb.md"
COLUMNS = ("F5 BIG-IP", "AWS NLB", "GCP passthrough Network LB")


def _duration_s(text: str) -> int:
    m = re.fullmatch(r"`?(\d+)s`?", text.strip())
    assert m, f"not a duration in seconds: {text!r}"
    return int(m.group(1))


@pytest.fixture(scope="module")
def node_ports() -> dict[int, int]:
    """targetPort -> nodePort of the example Service."""
    service = istio.load_one(istio.KUBERNETES / "service.yaml")
    assert service["spec"]["externalTrafficPolicy"] == "Local"
    return {p["targetPort"]: p["nodePort"] for p in service["spec"]["ports"]}


@pytest.fixture(scope="module")
def section() -> str:
    text = README.read_text()
    # From its heading to the end of the page (GCP's recipe is the page's last section).
    return text[text.index("### Other LBs, on paper"):]


@pytest.fixture(scope="module")
def table(section) -> dict[str, dict[str, str]]:
    """The recipe table of the section: row label -> {LB: cell}."""
    rows = [l for l in section.splitlines() if l.startswith("|")]
    header = [c.strip() for c in rows[0].strip("|").split("|")]
    assert tuple(header[1:]) == COLUMNS, header
    out = {}
    for row in rows[2:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        out[cells[0]] = dict(zip(COLUMNS, cells[1:]))
    for label in ("detection window", "`lb_buffer`", "`lb_fall`", "at DOWN, the connections in flight"):
        assert label in out, f"the table has no row {label!r}"
    return out


def _stated(table, lb: str) -> tuple[int, int, int]:
    """(detection window s, lb_buffer s, lb_fall) as the README states them for `lb`."""
    window = re.fullmatch(r"(\d+) s", table["detection window"][lb])
    assert window, table["detection window"][lb]
    return int(window.group(1)), _duration_s(table["`lb_buffer`"][lb]), int(table["`lb_fall`"][lb].strip("`"))


def test_the_section_names_the_service_s_ports_and_path(section, node_ports):
    # "30180 (→ 18180)" and "30080 (→ 8080)": the mapping as the Service has it.
    assert f"NodePort {node_ports[18180]} (→ 18180)" in section
    assert f"NodePort {node_ports[8080]} (→ 8080)" in section
    assert "`GET /health_check.html`" in section
    # each recipe is marked as not run, and cites its vendor's documentation
    for heading, vendor in (("### F5 BIG-IP (on paper)", "f5.com"),
                            ("### AWS NLB (on paper)", "docs.aws.amazon.com"),
                            ("### GCP passthrough Network LB (on paper)", "cloud.google.com")):
        start = section.index(heading)
        end = section.find("\n### ", start + 1)
        body = section[start:] if end < 0 else section[start:end]
        assert "On paper: not run here." in body, heading
        assert f"https://{vendor}" in body or f".{vendor}/" in body, heading


def commands_and_sources(path, prefix: str, hosts: tuple[str, ...]) -> list[str]:
    """The commands of a vendor CLI file, each checked to follow a comment that cites a source
    ([n]), every cited [n] listed at the end with a URL on one of `hosts`."""
    text = path.read_text()
    body, _, sources = text.partition("# Sources (")
    urls = dict(re.findall(r"^# \[(\d+)\] .*?\n#\s+.*?(https://[^\s]+)", sources, re.M | re.S))
    assert urls and all(re.match(rf"https://([\w-]+\.)*({'|'.join(map(re.escape, hosts))})/", u)
                            for u in urls.values()), urls
    commands, cited = [], None
    for line in body.splitlines():
        if line.startswith("#"):
            cited = set(re.findall(r"\[(\d+)\]", line)) or cited
        elif not line.strip():  # a comment speaks for the commands up to the next blank line
            cited = None
        else:
            assert line.startswith(prefix), line
            assert cited, f"{path.name}: no source cited for: {line}"
            assert cited <= set(urls), (line, cited - set(urls))
            commands.append(line)
    used = {n for n in re.findall(r"\[(\d+)\]", body)}
    assert used == set(urls), f"sources listed and not cited, or cited and not listed: {used ^ set(urls)}"
    return commands


def test_netscaler_monitor_service_groups_and_vservers(node_ports):
    """What the sidecar design ran on NetScaler: TLS offload on 443 with HTTP/2 and websockets,
    X-Forwarded-For, 80, TLS passthrough (SSL_BRIDGE) on 8443, one monitor on drain-gate's
    port, downStateFlush on every service group and vserver."""
    lines = commands_and_sources(istio.NETSCALER / "drain-gate.conf", ("add ", "bind ", "enable "),
                                 ("citrix.com", "netscaler.com"))
    (monitor,) = [l for l in lines if l.startswith("add lb monitor")]
    assert '-httpRequest "GET /health_check.html"' in monitor
    # HTTP/1.1 without Host gets 400 from Envoy: the monitor sends one.
    assert '-customHeaders "Host: drain-gate\\r\\n"' in monitor
    assert "-respCode 200" in monitor and f"-destPort {node_ports[18180]}" in monitor
    groups = {l.split()[2]: l for l in lines if l.startswith("add serviceGroup")}
    assert set(groups) == {"sg-istio-igw", "sg-istio-igw-tls"}
    assert groups["sg-istio-igw"].split()[3] == "HTTP" and "-cip ENABLED X-Forwarded-For" in groups["sg-istio-igw"]
    assert groups["sg-istio-igw-tls"].split()[3] == "SSL_BRIDGE"
    for name, port in (("sg-istio-igw", node_ports[8080]), ("sg-istio-igw-tls", node_ports[8443])):
        assert "-downStateFlush ENABLED" in groups[name]
        binds = [l for l in lines if l.startswith(f"bind serviceGroup {name} ")]
        members = [l for l in binds if "-monitorName" not in l]
        assert len(members) == 3 and all(l.endswith(f" {port}") for l in members), members
        assert f"bind serviceGroup {name} -monitorName mon-drain-gate" in binds
    (profile,) = [l for l in lines if l.startswith("add ns httpProfile")]
    assert "-http2 ENABLED" in profile and "-webSocket ENABLED" in profile
    vservers = {l.split()[3]: l.split() for l in lines if l.startswith("add lb vserver")}
    assert {k: (v[4], v[6]) for k, v in vservers.items()} == {
        "vs-istio-igw-443": ("SSL", "443"), "vs-istio-igw": ("HTTP", "80"), "vs-istio-igw-8443": ("SSL_BRIDGE", "8443")}
    for name, words in vservers.items():
        assert " ".join(words).endswith("-downStateFlush ENABLED"), name
        if words[4] != "SSL_BRIDGE":
            assert "-httpProfileName http-drain-gate" in " ".join(words), name
    assert "bind ssl vserver vs-istio-igw-443 -certkeyName igw-cert" in lines
    assert {l for l in lines if l.startswith("bind lb vserver")} == {
        "bind lb vserver vs-istio-igw-443 sg-istio-igw", "bind lb vserver vs-istio-igw sg-istio-igw",
        "bind lb vserver vs-istio-igw-8443 sg-istio-igw-tls"}
    # detection window (interval x retries + resptimeout) below the default lb_buffer (10 s)
    interval = int(re.search(r"-interval (\d+) SEC", monitor).group(1))
    retries = int(re.search(r"-retries (\d+)", monitor).group(1))
    resp = int(re.search(r"-resptimeout (\d+) SEC", monitor).group(1))
    window = interval * retries + resp
    assert window < 10
    text = (istio.NETSCALER / "drain-gate.conf").read_text()
    assert f"{interval} x {retries} + {resp} = {window} s" in text
    assert f"Its detection window is about {window} s" in " ".join(README.read_text().split())


def test_f5_monitor_and_pool(table, node_ports):
    lines = commands_and_sources(ENVOYFILTER / "f5" / "drain-gate.tmsh", ("create ",), ("f5.com",))
    (monitor,) = [l for l in lines if l.startswith("create ltm monitor http ")]
    assert f"destination *:{node_ports[18180]}" in monitor
    send = re.search(r'send "([^"]*)"', monitor).group(1)
    # HTTP/1.1 needs Host (Envoy answers 400 without one); the string is tmsh's, escapes as written
    assert send == r"GET /health_check.html HTTP/1.1\r\nHost: drain-gate\r\nConnection: close\r\n\r\n"
    recv = re.search(r' recv "([^"]*)"', monitor).group(1)
    disable = re.search(r' recv-disable "([^"]*)"', monitor).group(1)
    # drain-gate's answers as Envoy writes them: 200 "OK", 404 and 503 "DRAIN"
    ok = "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nOK"
    soft = "HTTP/1.1 404 Not Found\r\ncontent-type: text/plain\r\n\r\nDRAIN"
    down = "HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\n\r\nDRAIN"
    assert recv in ok and recv not in soft and recv not in down, recv
    assert disable in soft and disable not in ok and disable not in down, disable
    pools = {l.split()[3]: l for l in lines if l.startswith("create ltm pool ")}
    assert set(pools) == {"pool-istio-igw", "pool-istio-igw-tls"}
    for name, port in (("pool-istio-igw", node_ports[8080]), ("pool-istio-igw-tls", node_ports[8443])):
        assert "monitor mon-drain-gate" in pools[name] and "service-down-action reset" in pools[name]
        members = re.search(r"members add \{([^}]*)\}", pools[name]).group(1).split()
        assert len(members) == 3 and all(m.endswith(f":{port}") for m in members), members
    virtuals = {l.split()[3]: l for l in lines if l.startswith("create ltm virtual ")}
    assert {k: re.search(r"destination \S+:(\d+)", v).group(1) for k, v in virtuals.items()} == {
        "vs-istio-igw-443": "443", "vs-istio-igw": "80", "vs-istio-igw-8443": "8443"}
    assert "clientssl-igw { context clientside }" in virtuals["vs-istio-igw-443"]
    assert "http2 { context clientside }" in virtuals["vs-istio-igw-443"]
    assert all("http-drain-gate" in virtuals[v] for v in ("vs-istio-igw-443", "vs-istio-igw"))
    assert "pool pool-istio-igw-tls" in virtuals["vs-istio-igw-8443"] and "ssl" not in virtuals["vs-istio-igw-8443"]
    assert "insert-xforwarded-for enabled" in next(l for l in lines if l.startswith("create ltm profile http "))
    interval = int(re.search(r" interval (\d+)", monitor).group(1))
    timeout = int(re.search(r" timeout (\d+)", monitor).group(1))
    assert timeout == 3 * interval + 1, "F5's rule of thumb the README quotes"
    window, buffer, fall = _stated(table, "F5 BIG-IP")
    assert window == timeout and fall == timeout // interval
    assert buffer > window
    assert table["at DOWN, the connections in flight"]["F5 BIG-IP"].startswith("reset")


def test_aws_target_group(table, node_ports):
    template = json.loads((ENVOYFILTER / "aws" / "nlb-target-group.json").read_text())
    (tg,) = [r["Properties"] for r in template["Resources"].values()
             if r["Type"] == "AWS::ElasticLoadBalancingV2::TargetGroup"]
    assert tg["TargetType"] == "instance" and tg["Protocol"] == "TCP"
    assert tg["Port"] == node_ports[8080]
    assert all(t["Port"] == node_ports[8080] for t in tg["Targets"]) and len(tg["Targets"]) == 3
    assert tg["HealthCheckProtocol"] == "HTTP"  # a TCP check would pass on drain-gate's 503
    assert tg["HealthCheckPort"] == str(node_ports[18180])
    assert tg["HealthCheckPath"] == "/health_check.html"
    assert tg["Matcher"] == {"HttpCode": "200"}
    interval, timeout = tg["HealthCheckIntervalSeconds"], tg["HealthCheckTimeoutSeconds"]
    unhealthy = tg["UnhealthyThresholdCount"]
    # the ranges of AWS's CreateTargetGroup reference (on paper)
    assert 5 <= interval <= 300 and 2 <= timeout <= 120 and timeout < interval
    assert 2 <= unhealthy <= 10 and 2 <= tg["HealthyThresholdCount"] <= 10
    attrs = {a["Key"]: a["Value"] for a in tg["TargetGroupAttributes"]}
    assert attrs["target_health_state.unhealthy.connection_termination.enabled"] == "true"
    assert attrs["deregistration_delay.connection_termination.enabled"] == "false"
    assert 0 <= int(attrs["deregistration_delay.timeout_seconds"]) <= 3600
    assert attrs["load_balancing.cross_zone.enabled"] == "true"
    window, buffer, fall = _stated(table, "AWS NLB")
    assert window == interval * unhealthy + timeout and fall == unhealthy
    # New connections for up to 40 s after Unhealthy (users' reports, aws/containers-roadmap#470): CLOSING covers them.
    lag = re.fullmatch(r"up to 30–(\d+) s after DOWN \(reported\)", table["new connections stop"]["AWS NLB"])
    assert lag, table["new connections stop"]["AWS NLB"]
    assert buffer > window + int(lag.group(1))
    assert table["at DOWN, the connections in flight"]["AWS NLB"].startswith("reset")
    # Healthy again after the first check and HealthyThresholdCount good ones: minReadySeconds outlasts it.
    up = interval + tg["HealthyThresholdCount"] * interval
    assert table["UP again once the new pod is ready"]["AWS NLB"].startswith(f"≤ {up} s")
    assert _min_ready(table, "AWS NLB") >= up > istio.load_one(istio.KUBERNETES / "gateway-values.yaml")[
        "minReadySeconds"], "the values' minReadySeconds is too short for the NLB"


def _min_ready(table, lb: str) -> int:
    return int(table["`minReadySeconds` (gateway values)"][lb].strip("`"))


def test_every_lb_is_up_again_within_its_min_ready_seconds(table):
    """F5 and GCP put a node back within the gateway values' minReadySeconds; the row says so."""
    values = istio.load_one(istio.KUBERNETES / "gateway-values.yaml")
    gcp = {d["kind"]: d for d in yaml.safe_load_all((ENVOYFILTER / "gcp" / "backend-service.yaml").read_text())}
    hc = gcp["compute#healthCheck"]
    f5 = (ENVOYFILTER / "f5" / "drain-gate.tmsh").read_text()
    f5_interval = int(re.search(r" interval (\d+)", f5).group(1))
    for lb, up in (("F5 BIG-IP", f5_interval), ("GCP passthrough Network LB",
                                                  hc["checkIntervalSec"] * (1 + hc["healthyThreshold"]))):
        assert table["UP again once the new pod is ready"][lb].startswith(f"≤ {up} s"), lb
        assert _min_ready(table, lb) == values["minReadySeconds"] >= up, lb


def test_gcp_health_check_backend_service_and_forwarding_rule(table, node_ports):
    docs = list(yaml.safe_load_all((ENVOYFILTER / "gcp" / "backend-service.yaml").read_text()))
    by_kind = {d["kind"]: d for d in docs}
    assert set(by_kind) == {"compute#healthCheck", "compute#backendService", "compute#forwardingRule"}
    hc, bs, fr = (by_kind[k] for k in ("compute#healthCheck", "compute#backendService", "compute#forwardingRule"))
    assert hc["type"] == "HTTP"
    http = hc["httpHealthCheck"]
    assert http["port"] == node_ports[18180]
    assert http["requestPath"] == "/health_check.html" and http["host"]
    assert hc["timeoutSec"] <= hc["checkIntervalSec"]
    assert bs["loadBalancingScheme"] == "EXTERNAL" and bs["protocol"] == "TCP"
    assert bs["healthChecks"] == [f"projects/PROJECT/regions/REGION/healthChecks/{hc['name']}"]
    assert all(b["balancingMode"] == "CONNECTION" for b in bs["backends"]) and bs["backends"]
    tracking = bs["connectionTrackingPolicy"]
    assert tracking["trackingMode"] == "PER_CONNECTION"
    assert tracking["connectionPersistenceOnUnhealthyBackends"] == "DEFAULT_FOR_PROTOCOL"
    assert 0 <= bs["connectionDraining"]["drainingTimeoutSec"] <= 3600
    assert fr["backendService"].endswith(f"/backendServices/{bs['name']}")
    assert fr["ports"] == ["80", "443"] and fr["loadBalancingScheme"] == "EXTERNAL"
    window, buffer, fall = _stated(table, "GCP passthrough Network LB")
    assert window == hc["checkIntervalSec"] * hc["unhealthyThreshold"] + hc["timeoutSec"]
    assert fall == hc["unhealthyThreshold"] and buffer > window
    assert table["at DOWN, the connections in flight"]["GCP passthrough Network LB"].startswith("kept")


def test_the_files_state_the_windows_the_readme_states(table):
    """The comments of the files quote the same windows and lb_buffer as the table."""
    f5 = (ENVOYFILTER / "f5" / "drain-gate.tmsh").read_text()
    gcp = (ENVOYFILTER / "gcp" / "backend-service.yaml").read_text()
    w, b, _ = _stated(table, "F5 BIG-IP")
    assert f"({w} s here)" in f5 and f"lb_buffer above it ({b}s)" in f5
    w, b, _ = _stated(table, "GCP passthrough Network LB")
    assert f"= {w} s, below drain-gate's lb_buffer ({b}s)" in gcp
