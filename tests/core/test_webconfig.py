"""``--web.config.file`` (exporter-toolkit format): /metrics over real TLS with basic auth, on a real
``fabricmon agent`` process and on the aggregator's HTTP API; plus gzip, HEAD, the landing page,
build info and process metrics, and promtool's lint of what is served."""

from __future__ import annotations

import base64
import gzip
import http.client
import shutil
import ssl
import subprocess

import pytest
import yaml

from fabricmon.aggregator.engine import Engine
from fabricmon.aggregator.http_api import HttpApi
from fabricmon.configload import ConfigError
from fabricmon.topology import load_topology
from fabricmon.webconfig import load_web_config
from support.certs import make_pki
from support.procrig import Proc, agent_config, free_port, render_node, short_dir, topology_yaml, wait_until
from support.promtools import find_binary

bcrypt = pytest.importorskip("bcrypt", reason="basic_auth_users needs the bcrypt package")

USER, PASSWORD = "prometheus", "s3cret-scrape"


def _auth(user: str = USER, password: str = PASSWORD) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def _web(tmp_path, **extra) -> tuple[str, str]:
    pki = make_pki(tmp_path, {})
    key, cert = pki["server"]
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    doc = {"tls_server_config": {"cert_file": cert, "key_file": key}, "basic_auth_users": {USER: hashed}, **extra}
    path = tmp_path / "web.yml"
    path.write_text(yaml.safe_dump(doc))
    return str(path), pki["ca"]


def _get(port: int, path: str = "/metrics", *, tls_ca: str | None = None, headers: dict | None = None,
         method: str = "GET") -> tuple[int, dict, bytes]:
    if tls_ca:
        ctx = ssl.create_default_context(cafile=tls_ca)
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
    else:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, headers=headers or {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def _plain_refused(port: int) -> bool:
    try:
        code, _, _ = _get(port)
    except (OSError, http.client.HTTPException):
        return True
    return code >= 400 and code != 401


def test_agent_metrics_need_tls_and_password(tmp_path) -> None:
    web, ca = _web(tmp_path)
    tree = render_node(tmp_path / "node")
    sockdir = short_dir()
    port = free_port()
    cfg = agent_config(tree, listen=f"127.0.0.1:{port}", aggregator=None, spool=tmp_path / "spool",
                       sock=f"{sockdir}/ranks.sock")
    (tmp_path / "agent.yaml").write_text(yaml.safe_dump(cfg))
    proc = Proc(["agent", "--config", str(tmp_path / "agent.yaml"), "--web.config.file", web], tmp_path / "a.log")
    try:
        def served() -> bool:
            try:
                return b"fabricmon_collector_up" in _get(port, tls_ca=ca, headers=_auth())[2]
            except OSError:
                return False

        assert wait_until(served, 30), proc.text()
        assert _get(port, tls_ca=ca)[0] == 401
        code, headers, _ = _get(port, tls_ca=ca, headers=_auth(password="wrong"))
        assert code == 401 and headers["www-authenticate"].startswith("Basic")
        assert _get(port, tls_ca=ca, headers=_auth(user="nobody"))[0] == 401
        code, _, body = _get(port, tls_ca=ca, headers=_auth())
        assert code == 200 and b"fabricmon_build_info{" in body and b"process_cpu_seconds_total" in body
        assert _plain_refused(port)
        assert proc.alive()  # a plain-HTTP client on the TLS port does not hurt the listener
        assert _get(port, tls_ca=ca, headers=_auth())[0] == 200
    finally:
        assert proc.stop() == 0
        shutil.rmtree(sockdir, ignore_errors=True)


@pytest.fixture
def aggregator_http(tmp_path):
    web, ca = _web(tmp_path)
    engine = Engine(load_topology(topology_yaml(tmp_path / "topology.yaml")))
    api = HttpApi(engine, ("127.0.0.1", 0), web=load_web_config(web))
    api.start()
    yield api, ca
    api.stop()


def test_aggregator_metrics_need_tls_and_password(aggregator_http) -> None:
    api, ca = aggregator_http
    assert _get(api.port, tls_ca=ca)[0] == 401
    code, _, body = _get(api.port, tls_ca=ca, headers=_auth())
    assert code == 200 and b"fabricmon_agents_connected" in body and b"fabricmon_build_info{" in body
    assert _get(api.port, "/api/incidents", tls_ca=ca)[0] == 401
    assert _plain_refused(api.port)


def test_gzip_head_and_landing_page(aggregator_http) -> None:
    api, ca = aggregator_http
    h = _auth()
    _, _, plain = _get(api.port, tls_ca=ca, headers=h)
    code, headers, body = _get(api.port, tls_ca=ca, headers={**h, "Accept-Encoding": "gzip"})
    assert code == 200 and headers["content-encoding"] == "gzip"
    text = gzip.decompress(body)
    assert b"fabricmon_agents_connected" in text and len(body) < len(text)
    code, headers, _ = _get(api.port, tls_ca=ca, headers={**h, "Accept-Encoding": "gzip;q=0"})
    assert "content-encoding" not in headers
    code, headers, body = _get(api.port, tls_ca=ca, headers=h, method="HEAD")
    assert code == 200 and body == b"" and int(headers["content-length"]) > 0
    code, headers, body = _get(api.port, "/", tls_ca=ca, headers=h)
    assert code == 200 and headers["content-type"].startswith("text/html") and b'href="metrics"' in body
    assert plain.startswith(b"# HELP")


def test_agent_gzip_reuses_the_cached_snapshot(tmp_path) -> None:
    """The agent's gzip body is the cached per-poll member plus small per-scrape members: it
    decompresses to the plain body, and the snapshot's member is compressed once per snapshot."""
    from fabricmon.agent.runtime import build_agent
    from fabricmon.httpserve import Chunk
    from fabricmon.sim.agents import sim_agent_config

    tree = render_node(tmp_path / "node")
    agent = build_agent(sim_agent_config(tree, 1.0), inline_sources=True)
    port = agent.start_http("127.0.0.1:0")
    try:
        agent.poller.poll_once()
        code, headers, body = _get(port, headers={"Accept-Encoding": "gzip, deflate"})
        assert code == 200 and headers["content-encoding"] == "gzip"
        unzipped = gzip.decompress(body)
        assert b"fabricmon_collector_up" in unzipped and b"fabricmon_snapshot_age_seconds" in unzipped
        parts = agent._metrics()
        cached = [p for p in parts if isinstance(p, Chunk)]
        assert len(cached) == 2  # the snapshot, and the build and process metrics rendered with it
        assert body.startswith(cached[0].gzipped())  # the same bytes: not recompressed for this scrape
        assert cached[1].gzipped() in body
        _, _, again = _get(port, headers={"Accept-Encoding": "gzip"})
        assert again.startswith(cached[0].gzipped())
        code, headers, _ = _get(port)
        assert "content-encoding" not in headers
    finally:
        agent.stop()


@pytest.mark.skipif(find_binary(("promtool",)) is None, reason="promtool not installed")
def test_promtool_check_metrics_clean(aggregator_http, tmp_path) -> None:
    from fabricmon.agent.runtime import build_agent
    from fabricmon.sim.agents import sim_agent_config

    api, ca = aggregator_http
    tree = render_node(tmp_path / "node")
    agent = build_agent(sim_agent_config(tree, 1.0), inline_sources=True)
    port = agent.start_http("127.0.0.1:0")
    try:
        agent.poller.poll_once()
        bodies = [_get(port)[2], _get(api.port, tls_ca=ca, headers=_auth())[2]]
    finally:
        agent.stop()
    for body in bodies:
        assert b"process_resident_memory_bytes" in body and b"fabricmon_build_info{" in body
        res = subprocess.run([find_binary(("promtool",)), "check", "metrics"], input=body, capture_output=True,
                             timeout=60)
        assert res.returncode == 0 and not res.stdout.strip() and not res.stderr.strip(), res.stdout + res.stderr


@pytest.mark.parametrize("doc,needle", [
    ({"basic_auth_users": {"u": "plaintext"}}, "bcrypt hash"),
    ({"tls_server_config": {"cert_file": "missing.crt", "key_file": "missing.key"}}, "cert_file: no such file"),
    ({"http_server_config": {"http2": True}}, "http_server_config: not supported"),
    ({"tls_server_config": {"cert_file": "a", "key_file": "b", "cipher_suites": []}}, "cipher_suites: not supported"),
])
def test_bad_web_config_is_one_line(tmp_path, doc, needle) -> None:
    p = tmp_path / "web.yml"
    p.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=needle):
        load_web_config(str(p))


def test_client_cert_required(tmp_path) -> None:
    """client_auth_type RequireAndVerifyClientCert: a client without a certificate from client_ca_file fails."""
    pki = make_pki(tmp_path, {"scraper": ("prometheus", ())})
    key, cert = pki["server"]
    p = tmp_path / "web.yml"
    p.write_text(yaml.safe_dump({"tls_server_config": {"cert_file": cert, "key_file": key, "client_ca_file": pki["ca"],
                                                       "client_auth_type": "RequireAndVerifyClientCert"}}))
    engine = Engine(load_topology(topology_yaml(tmp_path / "topology.yaml")))
    api = HttpApi(engine, ("127.0.0.1", 0), web=load_web_config(str(p)))
    api.start()
    try:
        with pytest.raises((ssl.SSLError, OSError, http.client.HTTPException)):
            _get(api.port, tls_ca=pki["ca"])
        ctx = ssl.create_default_context(cafile=pki["ca"])
        ckey, ccert = pki["scraper"]
        ctx.load_cert_chain(ccert, ckey)
        conn = http.client.HTTPSConnection("127.0.0.1", api.port, context=ctx, timeout=10)
        conn.request("GET", "/metrics")
        assert conn.getresponse().status == 200
        conn.close()
    finally:
        api.stop()



@pytest.mark.integration
@pytest.mark.skipif(find_binary(("prometheus",)) is None, reason="prometheus not installed")
def test_real_prometheus_scrapes_over_tls_with_basic_auth(tmp_path) -> None:
    """Prometheus (Go's TLS, basic auth and gzip reader: it sends Accept-Encoding: gzip) scrapes the
    agent's multi-member gzip body and the aggregator; a job with the wrong password gets up == 0."""
    import json
    import urllib.parse

    from fabricmon.agent.runtime import build_agent
    from fabricmon.sim.agents import sim_agent_config
    from support.promtools import http as prom_http
    from support.promtools import prometheus_config, running_prometheus

    web_path, ca = _web(tmp_path)
    web = load_web_config(web_path)
    tree = render_node(tmp_path / "node")
    agent = build_agent(sim_agent_config(tree, 0.5), inline_sources=True)
    agent.web = web
    aport = agent.start_http("127.0.0.1:0")
    agent.start_polling()
    engine = Engine(load_topology(topology_yaml(tmp_path / "topology.yaml")))
    api = HttpApi(engine, ("127.0.0.1", 0), web=web)
    api.start()
    (tmp_path / "pw").write_text(PASSWORD)
    (tmp_path / "bad").write_text("wrong")

    def job(name: str, port: int, pw: str) -> dict:
        return {"job_name": name, "scheme": "https", "tls_config": {"ca_file": ca},
                "basic_auth": {"username": USER, "password_file": str(tmp_path / pw)},
                "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}

    cfg = prometheus_config(extra_scrape_configs=[job("agent", aport, "pw"), job("aggregator", api.port, "pw"),
                                                  job("badpw", api.port, "bad")])
    try:
        with running_prometheus(tmp_path / "prom", cfg) as prom:
            def query(q: str) -> dict:
                code, body = prom_http("GET", f"{prom.url}/api/v1/query?query={urllib.parse.quote(q)}")
                data = body if isinstance(body, dict) else json.loads(body)
                return {r["metric"].get("job"): float(r["value"][1]) for r in data["data"]["result"]}

            assert wait_until(lambda: query("up") == {"agent": 1.0, "aggregator": 1.0, "badpw": 0.0}, 30), \
                query("up")
            assert wait_until(lambda: set(query("fabricmon_build_info")) == {"agent", "aggregator"}, 30)
            assert wait_until(lambda: "agent" in query('fabricmon_collector_up{collector="infiniband"}'), 30)
            assert wait_until(lambda: "agent" in query("process_resident_memory_bytes"), 30)
    finally:
        agent.stop()
        api.stop()


def test_sighup_rereads_the_web_config(tmp_path) -> None:
    """A new password (or certificate) takes effect on SIGHUP; an invalid web config is refused and
    the listener keeps the one it had."""
    web, ca = _web(tmp_path)
    tree = render_node(tmp_path / "node")
    sockdir = short_dir()
    port = free_port()
    cfg = agent_config(tree, listen=f"127.0.0.1:{port}", aggregator=None, spool=tmp_path / "spool",
                       sock=f"{sockdir}/ranks.sock")
    (tmp_path / "agent.yaml").write_text(yaml.safe_dump(cfg))
    proc = Proc(["agent", "--config", str(tmp_path / "agent.yaml"), "--web.config.file", web], tmp_path / "a.log")

    def status(password: str) -> int:
        try:
            return _get(port, tls_ca=ca, headers=_auth(password=password))[0]
        except OSError:
            return 0

    try:
        assert wait_until(lambda: status(PASSWORD) == 200, 30), proc.text()
        doc = yaml.safe_load(open(web))
        doc["basic_auth_users"][USER] = bcrypt.hashpw(b"rotated", bcrypt.gensalt(rounds=4)).decode()
        with open(web, "w") as fh:
            yaml.safe_dump(doc, fh)
        proc.hup()
        assert proc.wait_log('"config_reloaded"'), proc.text()
        assert status("rotated") == 200 and status(PASSWORD) == 401
        doc["basic_auth_users"][USER] = "not-a-hash"
        with open(web, "w") as fh:
            yaml.safe_dump(doc, fh)
        proc.hup()
        assert proc.wait_log('"config_reload_failed"'), proc.text()
        assert "bcrypt hash" in proc.text()
        assert proc.alive() and status("rotated") == 200
    finally:
        assert proc.stop() == 0
        shutil.rmtree(sockdir, ignore_errors=True)
