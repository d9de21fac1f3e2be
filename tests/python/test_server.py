"""examples/flame-server over real HTTP on 127.0.0.1: /score returns the engine's scores
(batched through the scheduler by concurrent connections), bad bodies get 400 naming the
value, and /metrics, fetched like a Prometheus scrape, parses with prometheus_client's parser
and counts exactly the requests sent."""
import http.client
import json
import subprocess
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest

import flame
import flame_testlib as lib
from conftest import REPO
from flame import reference

parser = pytest.importorskip("prometheus_client.parser", reason="prometheus_client (requirements.txt) is not installed")

CASE = "pre_tanh_final_sumi_from_recent"  # sumi head, no side features


@pytest.fixture
def server(tmp_path):
    exe = REPO / "examples" / "flame-server"
    if not exe.exists():
        pytest.fail(f"{exe} is not built: run make")
    cfg = lib.CASES[CASE]
    path = tmp_path / "m.safetensors"
    reference.save(path, cfg, reference.random_model(cfg, 9))
    p = subprocess.Popen([str(exe), "--model", str(path), "--port", "0", "--max-wait-us", "2000"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        assert line.startswith("listening on http://127.0.0.1:"), (line, p.stderr.read() if p.poll() else "")
        yield cfg, path, line.split()[-1]
    finally:
        p.terminate()
        assert p.wait(30) == 0


def post(url, obj):
    req = urllib.request.Request(url + "/score", data=json.dumps(obj).encode(), method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def scrape(url):
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return {f.name: f for f in parser.text_string_to_metric_families(r.read().decode())}


def sample(fams, family, name, **labels):
    hits = [s.value for s in fams[family].samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(hits) == 1, (name, labels, hits)
    return hits[0]


def test_score_and_scrape_over_http(server):
    cfg, path, url = server
    rng = np.random.default_rng(5)
    reqs = [lib.random_request(cfg, rng, int(rng.integers(0, 7)), int(rng.integers(1, 20)))[:2] for _ in range(16)]
    with flame.Model(path) as m, flame.Engine(m) as e:
        want = [e.score(h, c) for h, c in reqs]
    got = [None] * len(reqs)

    def client(i):
        got[i] = post(url, {"history": reqs[i][0].tolist(), "candidates": reqs[i][1].tolist(),
                            "priority": 1 if i % 2 else 0})

    ts = [threading.Thread(target=client, args=(i,)) for i in range(len(reqs))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for (code, body), w in zip(got, want):
        assert code == 200, body
        assert lib.rel_err(np.asarray(body["scores"], dtype=np.float32), w) < 1e-5
    code, body = post(url, {"history": [1], "candidates": [1, 10**6]})
    assert code == 400 and "id 1000000 out of range" in body["error"]
    code, body = post(url, {"candidates": "x"})
    assert code == 400 and "'candidates' must be an array" in body["error"]
    code, body = post(url, {"candidates": [1], "priority": 7})
    assert code == 400 and "'priority' is 7, not -1, 0 or 1" in body["error"]
    fams = scrape(url)
    assert sample(fams, "flame_scheduler_requests", "flame_scheduler_requests_total", status="ok") == 16
    assert sample(fams, "flame_scheduler_requests", "flame_scheduler_requests_total", status="error") == 1
    assert sample(fams, "flame_scheduler_submitted", "flame_scheduler_submitted_total") == 17
    assert sample(fams, "flame_engine_candidates", "flame_engine_candidates_total") == sum(len(c) for _, c in reqs)
    assert sample(fams, "flame_scheduler_stage_seconds", "flame_scheduler_stage_seconds_count", stage="total") == 17
    batches = sum(s.value for s in fams["flame_scheduler_batches"].samples)
    assert 1 <= batches < 17  # concurrent connections share batches
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(url + "/nope", timeout=10)
    assert e.value.code == 404


def test_bodies_refused_with_the_reason(server):
    _, _, url = server
    host, port = url.split("//")[1].split(":")
    for data, what in ((b'{"history":[1],"candidates":[1]} trailing', "bytes after the JSON object (at offset 33)"),
                       (b'{"history":[1],"candidates":[1],"history":[2]}', "member 'history' appears twice"),
                       (b'{"history":[1],"candidate":[1]}', "unknown member 'candidate'"),
                       (b'{"candidates":[1],"timeout_us":0.5}', "'timeout_us' is 0.5, not an integer number"),
                       (b'{"candidates":[1],"priority":2000000000}', "'priority' is 2000000000, not -1, 0 or 1"),
                       (b'{"candidates":[1],"priority":"high"}', "'priority' is not a number (-1, 0 or 1)"),
                       (b'{"history\\u0000x":[1],"candidates":[2]}', "a NUL or raw control byte inside a string at "
                                                                   "offset 9"),
                       (b'{"history":[1],"candidates":[2],"priority\x01":1}', "raw control byte inside a string"),
                       (b'{"candidates":[1e300]}', "'candidates'[0] is not a non-negative integer id")):
        c = http.client.HTTPConnection(host, int(port), timeout=30)
        c.request("POST", "/score", body=data)
        r = c.getresponse()
        assert r.status == 400 and what in json.loads(r.read())["error"], data
        c.close()
    # a declared length over the bound is answered before any of the body is sent
    c = http.client.HTTPConnection(host, int(port), timeout=30)
    c.putrequest("POST", "/score")
    c.putheader("Content-Length", str(2 << 20))
    c.endheaders()
    r = c.getresponse()
    assert r.status == 413 and "over 1048576 bytes" in json.loads(r.read())["error"]
    c.close()
    code, body = post(url, {"history": [1], "candidates": [2], "priority": 1, "timeout_us": 10**6})
    assert code == 200 and len(body["scores"]) == 1


def test_arguments_are_whole_numbers():
    exe = REPO / "examples" / "flame-server"
    for args, what in ((["--port", "abc"], "--port abc is not a whole number in 0..65535"),
                       (["--port", "70000"], "--port 70000 is not a whole number"),
                       (["--workers", "5x"], "--workers 5x is not a whole number"),
                       (["--max-connections", "0"], "--max-connections 0 is not a whole number in 1..100000")):
        p = subprocess.run([str(exe)] + args, capture_output=True, text=True, timeout=30)
        assert p.returncode == 2 and what in p.stderr, (args, p.stderr)
