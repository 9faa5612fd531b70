#!/usr/bin/env python3
"""Renders the Grafana dashboard's queries over real traffic, with matplotlib.

Grafana cannot be installed on the build machine, so this is the substitute: it
starts the real server binary on the example repository, drives a
few minutes of real traffic at it with tritonclient, scrapes Tern's /metrics
every couple of seconds as Prometheus would, evaluates each panel's PromQL from
deploy/grafana/tern.json over those scrapes (a small evaluator for the subset
of PromQL the dashboard uses: `sum`/`max`/`avg` [`by (...)`] over an instant
selector or over `rate`/`increase` of a range selector, and `/` of two of
those) and draws one subplot per panel, laid out by the panels' gridPos.

    make dashboard-png      # builds what it needs, installs matplotlib, runs:
    .venv/bin/python scripts/dashboard_plot.py [--binary target/debug/tern]
        [--out docs/img/dashboard.png] [--seconds 150]

The repository served is a temporary folder of links to model_repository/'s
models plus two extras, so that the fault panels have something to show: the
test plugin `misbehave` (target/wasm32-wasip2/release/misbehave.wasm, built by
`make plugins`; left out if missing), asked now and then to trap, spin past its
deadline, blow its memory cap or fail, and `broken`, a plugin whose model.wasm
is not WebAssembly, whose loads through the repository API fail.

--save-scrapes keeps the raw scrapes (JSON); --from-scrapes redraws from them
without starting a server.
"""

import argparse
import json
import math
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "tern.json")

# Values of the dashboard's template variables: "All" for both, as a freshly
# opened dashboard shows.
VARIABLES = {"instance": ".*", "model": ".*"}

# The phases of the traffic, as fractions of --seconds.
PHASES = [
    (0.00, 0.20, "steady"),
    (0.20, 0.45, "ramp + batching bursts"),
    (0.45, 0.70, "faults"),
    (0.70, 1.00, "cool-down + reload"),
]


# --- the dashboard -------------------------------------------------------


def dashboard():
    with open(DASHBOARD) as f:
        return json.load(f)


def panels(d):
    """Every panel, rows included, the collapsed rows' panels too (as tests/test_deploy.py walks them)."""
    for p in d["panels"]:
        yield p
        yield from p.get("panels", [])


def layout(d):
    """[(row panel, [panels in it])] in dashboard order."""
    rows = []
    for p in d["panels"]:
        if p["type"] == "row":
            rows.append((p, list(p.get("panels", []))))
        elif rows:
            rows[-1][1].append(p)
        else:
            rows.append(({"title": "", "collapsed": False}, [p]))
    return rows


# --- a PromQL evaluator for the dashboard's subset -------------------------


class Expr:
    """AGG [by (labels)] (inner), or a / b of two of them."""

    def __init__(self, kind, **kw):
        self.kind = kind
        self.__dict__.update(kw)


TOKEN = re.compile(
    r"""\s*(?:
      (?P<num>\d+(?:\.\d+)?[smhd]?)
    | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
    | (?P<str>"(?:[^"\\]|\\.)*")
    | (?P<op>=~|!~|!=|[(){}\[\],=/])
    )""",
    re.X,
)


def tokenize(s):
    out, pos = [], 0
    s = s.strip()
    while pos < len(s):
        m = TOKEN.match(s, pos)
        if not m or m.end() == pos:
            raise ValueError(f"cannot tokenize {s[pos:pos + 20]!r} in {s!r}")
        kind = m.lastgroup
        out.append((kind, m.group(kind)))
        pos = m.end()
        while pos < len(s) and s[pos].isspace():
            pos += 1
    return out


def parse(expr):
    """Parses one of the dashboard's expressions; raises on anything outside the subset."""
    toks = tokenize(expr)
    i = 0

    def peek(v=None):
        if i < len(toks) and (v is None or toks[i][1] == v):
            return toks[i]
        return None

    def take(v=None, kind=None):
        nonlocal i
        if i >= len(toks):
            raise ValueError(f"unexpected end of {expr!r}")
        t = toks[i]
        if (v is not None and t[1] != v) or (kind is not None and t[0] != kind):
            raise ValueError(f"expected {v or kind}, got {t[1]!r} in {expr!r}")
        i += 1
        return t[1]

    def selector():
        name = take(kind="ident")
        matchers = []
        if peek("{"):
            take("{")
            while not peek("}"):
                label = take(kind="ident")
                op = take()
                if op not in ("=", "=~", "!=", "!~"):
                    raise ValueError(f"matcher op {op!r} in {expr!r}")
                value = json.loads(take(kind="str"))
                matchers.append((label, op, value))
                if peek(","):
                    take(",")
            take("}")
        return name, matchers

    def term():
        agg = take(kind="ident")
        if agg not in ("sum", "max", "avg"):
            raise ValueError(f"aggregation {agg!r} not supported in {expr!r}")
        by = None
        if peek("by"):
            take("by")
            take("(")
            by = []
            while not peek(")"):
                by.append(take(kind="ident"))
                if peek(","):
                    take(",")
            take(")")
        take("(")
        func = None
        if i + 1 < len(toks) and toks[i + 1][1] == "(":
            func = take(kind="ident")
            if func not in ("rate", "increase"):
                raise ValueError(f"function {func!r} not supported in {expr!r}")
            take("(")
        name, matchers = selector()
        window = None
        if func:
            take("[")
            t = take()
            if t == "$":  # never: `$__rate_interval` is substituted before parsing
                raise ValueError(expr)
            window = t
            take("]")
            take(")")
        take(")")
        return Expr("agg", agg=agg, by=by, func=func, name=name, matchers=matchers, window=window)

    left = term()
    if peek("/"):
        take("/")
        right = term()
        left = Expr("div", left=left, right=right)
    if i != len(toks):
        raise ValueError(f"trailing {toks[i:]} in {expr!r}")
    return left


def substitute(expr, rate_window):
    for k, v in VARIABLES.items():
        expr = expr.replace(f"${k}", v)
    return expr.replace("$__rate_interval", f"{int(round(rate_window))}s")


def duration(s):
    mult = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    return float(s[:-1]) * mult[s[-1]] if s[-1] in mult else float(s)


def matches(labels, matchers):
    for label, op, value in matchers:
        got = labels.get(label, "")
        if op == "=":
            ok = got == value
        elif op == "!=":
            ok = got != value
        elif op == "=~":
            ok = re.fullmatch(value, got) is not None
        else:
            ok = re.fullmatch(value, got) is None
        if not ok:
            return False
    return True


def extrapolated(ts, vs, t, window, is_rate):
    """Prometheus' extrapolatedRate for a counter over samples in (t - window, t]."""
    if len(ts) < 2:
        return None
    result = vs[-1] - vs[0]
    for a, b in zip(vs, vs[1:]):
        if b < a:  # counter reset
            result += a
    start, end = t - window, t
    to_start = ts[0] - start
    to_end = end - ts[-1]
    sampled = ts[-1] - ts[0]
    if sampled <= 0:
        return None
    avg = sampled / (len(ts) - 1)
    if result > 0 and vs[0] >= 0:
        to_zero = sampled * (vs[0] / result)
        if to_zero < to_start:
            to_start = to_zero
    threshold = avg * 1.1
    interval = sampled
    interval += to_start if to_start < threshold else avg / 2
    interval += to_end if to_end < threshold else avg / 2
    factor = interval / sampled
    if is_rate:
        factor /= window
    return result * factor


class Store:
    """The scrapes: per series (labels incl. __name__ and instance), its samples."""

    def __init__(self, scrapes):
        self.times = [s["t"] for s in scrapes]
        self.series = {}
        for s in scrapes:
            for key, v in s["samples"]:
                k = tuple(sorted(key.items()))
                self.series.setdefault(k, ([], []))
                self.series[k][0].append(s["t"])
                self.series[k][1].append(v)
        self.by_name = {}
        for k in self.series:
            self.by_name.setdefault(dict(k)["__name__"], []).append(k)

    def matching(self, name, matchers):
        """(labels, timestamps, values) of every scraped series of `name` the matchers select."""
        for k in self.by_name.get(name, []):
            labels = dict(k)
            if matches(labels, matchers):
                yield labels, *self.series[k]

    def instant(self, name, matchers, t, lookback=300.0):
        out = []
        for labels, ts, vs in self.matching(name, matchers):
            j = np.searchsorted(ts, t, side="right") - 1
            if j >= 0 and t - ts[j] <= lookback:
                out.append((labels, vs[j]))
        return out

    def ranged(self, name, matchers, t, window, is_rate):
        out = []
        for labels, ts, vs in self.matching(name, matchers):
            lo = np.searchsorted(ts, t - window, side="right")
            hi = np.searchsorted(ts, t, side="right")
            v = extrapolated(ts[lo:hi], vs[lo:hi], t, window, is_rate)
            if v is not None:
                out.append((labels, v))
        return out


def evaluate(e, store, t):
    """{labels tuple: value} at time t."""
    if e.kind == "div":
        left, right = evaluate(e.left, store, t), evaluate(e.right, store, t)
        out = {}
        for k, v in left.items():
            if k in right:
                d = right[k]
                out[k] = v / d if d != 0 else (math.nan if v == 0 else math.copysign(math.inf, v))
        return out
    if e.func:
        vec = store.ranged(e.name, e.matchers, t, duration(e.window), e.func == "rate")
    else:
        vec = store.instant(e.name, e.matchers, t)
    groups = {}
    for labels, v in vec:
        key = tuple((b, labels.get(b, "")) for b in (e.by or []))
        groups.setdefault(key, []).append(v)
    agg = {"sum": sum, "max": max, "avg": lambda xs: sum(xs) / len(xs)}[e.agg]
    return {k: agg(vs) for k, vs in groups.items()}


def legend(fmt, labels):
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: dict(labels).get(m.group(1), ""), fmt).strip()


def panel_series(panel, store, times, rate_window):
    """[(legend, np.array over times, first label dict)] for every target of the panel."""
    out = []
    for target in panel["targets"]:
        e = parse(substitute(target["expr"], rate_window))
        cols = {}
        for j, t in enumerate(times):
            for k, v in evaluate(e, store, t).items():
                cols.setdefault(k, np.full(len(times), np.nan))[j] = v
        for k, arr in sorted(cols.items()):
            out.append((legend(target.get("legendFormat", ""), k) or target["refId"], arr, dict(k)))
    return out


# --- metrics text --------------------------------------------------------

LINE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\d+)?$")
LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?')


def parse_metrics(text, instance):
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = LINE.match(line)
        if not m:
            continue
        labels = {k: v.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\") for k, v in LABEL.findall(m.group(2) or "")}
        labels["__name__"] = m.group(1)
        labels["instance"] = instance  # added by Prometheus at scrape time
        labels["job"] = "tern"
        try:
            out.append((labels, float(m.group(3))))
        except ValueError:
            pass
    return out


# --- the server and the traffic ------------------------------------------


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


BROKEN_CONFIG = """name: "broken"
backend: "wasm"
max_batch_size: 0
input [ { name: "MODE" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

# As the tests configure it (scripts/gen_models.py) but with a 2 s deadline, so
# that a request that sleeps holds the one instance across a scrape with a
# backlog behind it (the pending-requests panel).
MISBEHAVE_CONFIG = """name: "misbehave"
backend: "wasm"
max_batch_size: 0
input [ { name: "MODE" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ 1 ] } ]
parameters { key: "execution_timeout_ms" value: { string_value: "2000" } }
"""


def make_repo(tmp, plugins_dir):
    """Links to model_repository/'s models, plus misbehave (if built) and broken."""
    repo = os.path.join(tmp, "models")
    os.makedirs(repo)
    src = os.path.join(ROOT, "model_repository")
    models = []
    for name in sorted(os.listdir(src)):
        if os.path.exists(os.path.join(src, name, "config.pbtxt")):
            os.symlink(os.path.join(src, name), os.path.join(repo, name))
            models.append(name)
    misbehave = os.path.join(plugins_dir, "misbehave.wasm")
    if os.path.exists(misbehave):
        os.makedirs(os.path.join(repo, "misbehave", "1"))
        shutil.copy(misbehave, os.path.join(repo, "misbehave", "1", "model.wasm"))
        with open(os.path.join(repo, "misbehave", "config.pbtxt"), "w") as f:
            f.write(MISBEHAVE_CONFIG)
        models.append("misbehave")
    else:
        print(f"note: {misbehave} not built (make plugins): no plugin faults will be driven", file=sys.stderr)
    os.makedirs(os.path.join(repo, "broken", "1"))
    with open(os.path.join(repo, "broken", "1", "model.wasm"), "wb") as f:
        f.write(b"this is not WebAssembly\n")
    with open(os.path.join(repo, "broken", "config.pbtxt"), "w") as f:
        f.write(BROKEN_CONFIG)
    return repo, models


class Server:
    def __init__(self, binary, repo, models, tmp):
        self.http, self.grpc, self.metrics = free_port(), free_port(), free_port()
        env = dict(os.environ)
        env["ORT_DYLIB_PATH"] = os.path.join(ROOT, ".cache", "onnxruntime", "libonnxruntime.so")
        env["TERN_WASM_CACHE_DIR"] = os.path.join(tmp, "wasm-cache")
        args = [
            binary,
            f"--model-repository={repo}",
            "--model-control-mode=explicit",
            *[f"--load-model={m}" for m in models],
            f"--http-port={self.http}",
            "--http-address=127.0.0.1",
            f"--grpc-port={self.grpc}",
            "--grpc-address=127.0.0.1",
            f"--metrics-port={self.metrics}",
            "--metrics-address=127.0.0.1",
        ]
        self.log = open(os.path.join(tmp, "tern.log"), "wb")
        self.proc = subprocess.Popen(args, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 180
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"tern exited with {self.proc.returncode}; log: {self.log.name}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/v2/health/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"tern not ready after 180 s; log: {self.log.name}")
            time.sleep(0.5)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def phase_at(frac):
    for lo, hi, name in PHASES:
        if lo <= frac < hi:
            return name, (frac - lo) / (hi - lo)
    return PHASES[-1][2], 1.0


def base_rate(frac):
    """Requests/s for one main worker: low, a linear ramp, high, low."""
    name, within = phase_at(frac)
    if name == "steady":
        return 3.0
    if name == "ramp + batching bursts":
        return 3.0 + 27.0 * within
    if name == "faults":
        return 15.0
    return 3.0


class Traffic:
    def __init__(self, server, seconds, have_misbehave):
        import tritonclient.grpc as grpcclient
        import tritonclient.http as httpclient

        self.g, self.h = grpcclient, httpclient
        self.srv = server
        self.seconds = seconds
        self.have_misbehave = have_misbehave
        self.stop = threading.Event()
        self.t0 = None
        self.counts = {}
        self.lock = threading.Lock()
        self.events = []

    def frac(self):
        return (time.monotonic() - self.t0) / self.seconds

    def count(self, what):
        with self.lock:
            self.counts[what] = self.counts.get(what, 0) + 1

    def event(self, what):
        self.events.append((time.monotonic() - self.t0, what))
        print(f"[{time.monotonic() - self.t0:6.1f}s] {what}", file=sys.stderr)

    def http(self):
        return self.h.InferenceServerClient(f"127.0.0.1:{self.srv.http}", connection_timeout=30, network_timeout=30)

    def grpc(self):
        return self.g.InferenceServerClient(f"127.0.0.1:{self.srv.grpc}")

    def infer(self, client, model, inputs, **kw):
        try:
            client.infer(model, inputs, **kw)
            self.count(f"{model} ok")
        except Exception:  # noqa: BLE001 (failures are part of the traffic)
            self.count(f"{model} failed")

    def tensor(self, mod, name, arr, dtype):
        i = mod.InferInput(name, list(arr.shape), dtype)
        i.set_data_from_numpy(arr)
        return i

    # One loop per worker: `rate(frac)` requests/s of `make(rng)`.
    def paced(self, name, rate, make, seed):
        rng = random.Random(seed)
        client = None
        while not self.stop.is_set():
            frac = self.frac()
            if frac >= 1:
                break
            r = rate(frac)
            if r <= 0:
                self.stop.wait(0.25)
                continue
            mod, model, inputs = make(rng)
            if client is None or client[0] is not mod:
                client = (mod, self.http() if mod is self.h else self.grpc())
            self.infer(client[1], model, inputs)
            self.stop.wait(rng.expovariate(r))

    def simple(self, rng, mod=None, bad=False):
        mod = mod or self.h
        b = rng.randint(1, 4)
        a = np.arange(16 * b, dtype=np.int32).reshape(b, 16)
        if bad:  # wrong shape: the server refuses it (reason OTHER)
            a = np.zeros((1, 8), dtype=np.int32)
        return mod, "simple", [self.tensor(mod, "INPUT0", a, "INT32"), self.tensor(mod, "INPUT1", a, "INT32")]

    def add_sub(self, rng, bad=False):
        mod = self.g
        a = np.full((1, 4), rng.random(), dtype=np.float32)
        if bad:
            a = np.zeros((1, 5), dtype=np.float32)
        return mod, "add_sub", [self.tensor(mod, "INPUT0", a, "FP32"), self.tensor(mod, "INPUT1", a, "FP32")]

    def prep(self, model):
        def make(rng):
            mod = self.h
            a = np.full((1, 4), 2.0, dtype=np.float32)
            text = np.array([[f"Hello, World! request {rng.randint(0, 999)}".encode()]], dtype=np.object_)
            return mod, model, [
                self.tensor(mod, "INPUT0", a, "FP32"),
                self.tensor(mod, "INPUT1", a, "FP32"),
                self.tensor(mod, "TEXT", text, "BYTES"),
            ]

        return make

    def embed(self, rng):
        mod = self.h
        words = ["the", "server", "answers", "quickly", "a", "plugin", "tokenises", "text", "again"]
        s = " ".join(rng.choice(words) for _ in range(rng.randint(3, 12)))
        return mod, "text_embedding", [self.tensor(mod, "TEXT", np.array([[s.encode()]], dtype=np.object_), "BYTES")]

    def mode(self, m, mod=None):
        mod = mod or self.h
        return mod, "misbehave", [self.tensor(mod, "MODE", np.array([m.encode()], dtype=np.object_), "BYTES")]

    def burst(self, seed):
        """Back-to-back add_sub from several threads during the ramp: dynamic batching."""
        rng = random.Random(seed)
        c = self.grpc()
        while not self.stop.is_set() and self.frac() < 1:
            name, within = phase_at(self.frac())
            if name == "ramp + batching bursts" and within > 0.3:
                _, model, inputs = self.add_sub(rng)
                self.infer(c, model, inputs)
                self.stop.wait(0.02)
            else:
                self.stop.wait(0.2)

    def faults(self):
        """The misbehaving plugin and the repository API, at set points of the faults phase."""
        h = self.http()
        g = self.grpc()
        lo, hi, _ = PHASES[2]
        plan = []
        if self.have_misbehave:
            steps = ["error", "panic", "sleep", "memory", "loop", "bad_shape", "sleep", "panic", "error", "memory", "sleep"]
            plan += [(lo + (hi - lo) * (0.04 + 0.085 * k), m) for k, m in enumerate(steps)]
        plan += [(lo + (hi - lo) * 0.33, "load broken"), (lo + (hi - lo) * 0.75, "load broken")]
        rlo, rhi, _ = PHASES[3]
        plan += [(rlo + (rhi - rlo) * 0.25, "reload prep_c")]
        plan.sort()
        rng = random.Random(8)
        for at, what in plan:
            while self.frac() < at:
                if self.stop.wait(0.1):
                    return
                if self.have_misbehave and rng.random() < 0.05:
                    self.infer(h, *self.mode("ok")[1:])
            self.event(what)
            if what == "load broken":
                try:
                    h.load_model("broken")
                except Exception:  # noqa: BLE001
                    self.count("broken load failed")
            elif what == "reload prep_c":
                h.unload_model("prep_c")
                while h.is_model_ready("prep_c"):
                    time.sleep(0.1)
                h.load_model("prep_c")
            elif what == "sleep":
                # Holds the one instance until its 2 s deadline. Behind it: one
                # gRPC request that gives up after 0.5 s (CANCELED) and 3 that wait.
                held = threading.Thread(target=self.infer, args=(h, *self.mode("sleep")[1:]))
                held.start()
                time.sleep(0.1)
                backlog = [threading.Thread(target=self.infer, args=(g, *self.mode("ok", self.g)[1:]), kwargs={"client_timeout": 0.5})]
                backlog += [threading.Thread(target=self.infer, args=(self.http(), *self.mode("ok")[1:])) for _ in range(3)]
                for t in backlog:
                    t.start()
                    time.sleep(0.02)
                for t in [held, *backlog]:
                    t.join()
            else:
                self.infer(h, *self.mode(what)[1:])

    def run(self):
        self.t0 = time.monotonic()
        workers = [
            threading.Thread(target=self.paced, args=("simple", base_rate, self.simple, 1)),
            threading.Thread(target=self.paced, args=("add_sub", base_rate, self.add_sub, 2)),
            threading.Thread(target=self.paced, args=("prep_rust", lambda f: base_rate(f) / 3, self.prep("prep_rust"), 3)),
            threading.Thread(target=self.paced, args=("prep_js", lambda f: base_rate(f) / 6, self.prep("prep_js"), 4)),
            threading.Thread(target=self.paced, args=("text_embedding", lambda f: 1.0 if f < 0.9 else 0.0, self.embed, 5)),
            threading.Thread(
                target=self.paced,
                args=("bad simple", lambda f: 2.0 if phase_at(f)[0] == "faults" else 0.0, lambda r: self.simple(r, bad=True), 6),
            ),
            threading.Thread(
                target=self.paced,
                args=("bad add_sub", lambda f: 1.0 if phase_at(f)[0] == "faults" else 0.0, lambda r: self.add_sub(r, bad=True), 7),
            ),
            threading.Thread(target=self.faults),
        ]
        workers += [threading.Thread(target=self.burst, args=(10 + k,)) for k in range(4)]
        for w in workers:
            w.daemon = True
            w.start()
        return workers


def scrape_loop(server, interval, stop, scrapes, t0):
    url = f"http://127.0.0.1:{server.metrics}/metrics"
    instance = f"127.0.0.1:{server.metrics}"
    nxt = time.monotonic()
    while not stop.is_set():
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                text = r.read().decode()
            t = time.monotonic() - t0
            scrapes.append({"t": t, "samples": parse_metrics(text, instance)})
        except OSError as e:
            print(f"scrape failed: {e}", file=sys.stderr)
        nxt += interval
        stop.wait(max(0.0, nxt - time.monotonic()))


def run_traffic(args):
    tmp = tempfile.mkdtemp(prefix="tern-dashboard-")
    try:
        repo, models = make_repo(tmp, args.plugins_dir)
        print(f"starting {args.binary} on {len(models)} models", file=sys.stderr)
        t_start = time.monotonic()
        server = Server(args.binary, repo, models, tmp)
        print(f"ready in {time.monotonic() - t_start:.1f} s (http {server.http}, grpc {server.grpc}, metrics {server.metrics})", file=sys.stderr)
        try:
            scrapes = []
            stop = threading.Event()
            # Scrape a little before and after the traffic too.
            t0 = time.monotonic() + 2 * args.scrape_interval
            scraper = threading.Thread(target=scrape_loop, args=(server, args.scrape_interval, stop, scrapes, t0))
            scraper.start()
            time.sleep(max(0.0, t0 - time.monotonic()))
            traffic = Traffic(server, args.seconds, "misbehave" in models)
            workers = traffic.run()
            for w in workers:
                w.join(args.seconds + 60)
            traffic.stop.set()
            time.sleep(3 * args.scrape_interval)
            stop.set()
            scraper.join()
        finally:
            server.stop()
        print("requests: " + ", ".join(f"{k} {v}" for k, v in sorted(traffic.counts.items())), file=sys.stderr)
        return {
            "seconds": args.seconds,
            "scrape_interval": args.scrape_interval,
            "models": models,
            "counts": traffic.counts,
            "events": traffic.events,
            "scrapes": scrapes,
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --- drawing -------------------------------------------------------------


def scale_for(unit, vmax):
    """(divisor, axis label) in the way Grafana auto-scales the panel's unit."""
    if unit == "µs":
        if vmax >= 1e6:
            return 1e6, "s"
        if vmax >= 1e3:
            return 1e3, "ms"
        return 1, "µs"
    if unit == "bytes":
        for div, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
            if vmax >= div:
                return div, name
        return 1, "B"
    if unit == "percentunit":
        return 0.01, "%"
    return 1, {"reqps": "req/s", "ops": "ops/s", "s": "s", "watt": "W"}.get(unit, "")


def draw(data, out, dpi=80):
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.gridspec import GridSpec
    from matplotlib.lines import Line2D

    d = dashboard()
    titles = {p["title"] for p in panels(d) if p["type"] != "row"}
    interval = data["scrape_interval"]
    rate_window = 4 * interval  # Grafana's $__rate_interval, the data source's scrape interval set to the real one
    store = Store(data["scrapes"])
    times = np.array(store.times)
    seconds = data["seconds"]

    # Which panels get a subplot: every panel of an open row whose queries return data.
    plotted, skipped = [], []
    for row, ps in layout(d):
        if row.get("collapsed"):
            skipped.append((row["title"], [p["title"] for p in ps], "a collapsed row; NVML exports nothing without an NVIDIA GPU"))
            continue
        kept = []
        for p in ps:
            series = panel_series(p, store, times, rate_window)
            if not any(np.isfinite(s[1]).any() for s in series):
                skipped.append((row["title"], [p["title"]], "no data: exported only where CUDA found a GPU"))
                kept.append((p, None))
            else:
                kept.append((p, series))
        plotted.append((row, kept))

    # The checks: every panel drawn is one of tern.json's, by title; every
    # panel of tern.json is drawn or named as not drawn; and every series
    # comes from the panel's own targets (the legends are theirs).
    drawn_titles = [p["title"] for _, kept in plotted for p, s in kept if s is not None]
    for t in drawn_titles:
        assert t in titles, f"drawn panel {t!r} is not in {DASHBOARD}"
    assert sorted(drawn_titles + [t for _, ts, _ in skipped for t in ts]) == sorted(titles), "a dashboard panel is neither drawn nor named"
    for _, kept in plotted:
        for p, series in kept:
            for leg, _, lab in series or []:
                assert any(legend(t.get("legendFormat", ""), lab) == leg or t["refId"] == leg for t in p["targets"]), (p["title"], leg)

    # Colours by model, the same in every panel, for the models with something
    # to show: a non-zero series in a per-model panel, or a load time that
    # changed during the run. The rest (load times only) are grey.
    active = set()
    for _, kept in plotted:
        for p, series in kept:
            for _, arr, lab in series or []:
                a = arr[np.isfinite(arr)]
                if "model" in lab and len(a) and (np.ptp(a) > 0 if p.get("fieldConfig", {}).get("defaults", {}).get("unit") == "s" else np.abs(a).max() > 0):
                    active.add(lab["model"])
    palette = [c for k, c in enumerate(plt.get_cmap("tab10").colors) if k != 7]  # no grey: grey is for the rest
    palette += ["#000000", "#999933", "#882255", "#44aa99", "#332288"]
    model_colour = {m: palette[i % len(palette)] for i, m in enumerate(sorted(active))}
    reason_colour = {"REJECTED": "#8c564b", "CANCELED": "#ff7f0e", "BACKEND": "#d62728", "OTHER": "#9467bd"}
    styles = ["-", "--", ":"]
    used_models = set()

    # Layout by gridPos: a title strip per row, then its lines of panels.
    lines = []
    for row, kept in plotted:
        lines.append(("row", row["title"]))
        for y in sorted({p["gridPos"]["y"] for p, _ in kept}):
            lines.append(("panels", [(p, s) for p, s in kept if p["gridPos"]["y"] == y]))
    head_h, row_h, panel_h, foot_h = 1.95, 0.32, 2.45, 0.75
    fig_w = 17.0
    fig_h = head_h + foot_h + sum(row_h if k == "row" else panel_h for k, _ in lines)
    fig = plt.figure(figsize=(fig_w, fig_h), dpi=dpi)
    gs = GridSpec(
        len(lines), 24, figure=fig,
        height_ratios=[row_h if k == "row" else panel_h for k, _ in lines],
        left=0.045, right=0.985, top=1 - head_h / fig_h, bottom=foot_h / fig_h, hspace=0.72, wspace=1.7,
    )
    t_lo, t_hi = times[0], times[-1]

    def phase_bands(ax, label):
        for k, (lo, hi, name) in enumerate(PHASES):
            if k % 2:
                ax.axvspan(lo * seconds, hi * seconds, color="#000000", alpha=0.045, lw=0)
            if label:
                ax.text((lo + hi) / 2 * seconds, 0.97, name, transform=ax.get_xaxis_transform(), ha="center", va="top", fontsize=7, color="#666666")

    first = True
    for li, (kind, content) in enumerate(lines):
        if kind == "row":
            ax = fig.add_subplot(gs[li, :])
            ax.axis("off")
            ax.text(0, -1.2, "▾ " + content, fontsize=12.5, fontweight="bold", va="bottom", transform=ax.transAxes)
            continue
        for p, series in content:
            g = p["gridPos"]
            ax = fig.add_subplot(gs[li, g["x"]: g["x"] + g["w"]])
            if series is None:
                ax.axis("off")
                ax.text(0.5, 0.5, f"“{p['title']}”: not drawn\n(no GPU here; the series are not exported)", ha="center", va="center", fontsize=9.5, color="#777777", transform=ax.transAxes)
                continue
            ax.set_title(p["title"], fontsize=10.5, loc="left", fontweight="bold")
            unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
            if p["type"] == "stat":
                ax.axis("off")
                vals = [(leg, arr[np.isfinite(arr)][-1]) for leg, arr, _ in series if np.isfinite(arr).any()]
                for k, (leg, v) in enumerate(vals):
                    x = (k + 0.5) / len(vals)
                    ax.text(x, 0.55, f"{v:g}", fontsize=30, ha="center", va="center", color=["#2ca02c", "#1f77b4"][k % 2], transform=ax.transAxes)
                    ax.text(x, 0.25, leg, fontsize=9.5, ha="center", va="center", transform=ax.transAxes)
                ax.text(0.5, 0.03, "(stat panel: last value at the end of the run)", fontsize=7.5, ha="center", color="#777777", transform=ax.transAxes)
                continue
            ax.tick_params(labelsize=7.5)
            for spine in ("top", "right"):
                ax.spines[spine].set_visible(False)
            finite = [s for s in series if np.isfinite(s[1]).any()]
            # Series that stay at zero are hidden when others are not (Grafana's
            # "hide series with only zeros"); the panel says how many.
            nonzero = [s for s in finite if np.nanmax(np.abs(s[1][np.isfinite(s[1])])) > 0]
            shown = nonzero or finite
            hidden = len(series) - len(shown)
            vmax = max(np.nanmax(s[1][np.isfinite(s[1])]) for s in shown)
            div, ylabel = scale_for(unit, vmax)
            # Latencies and load times that span orders of magnitude across
            # models (misbehave's backlog waits ~2 s, the rest take ms) go on a
            # log axis, said so on the axis; the dashboard's panels are linear.
            peaks = sorted(np.nanmax(s[1][np.isfinite(s[1])]) for s in shown)
            log = unit in ("µs", "s") and len(peaks) > 2 and peaks[-1] > 30 * max(peaks[len(peaks) // (2 if unit == "µs" else 4)], 1e-12)
            if log:
                div, ylabel = scale_for(unit, 0)
            phase_bands(ax, first)
            first = False
            targets = [t.get("legendFormat", "") for t in p["targets"]]
            per_model = all("model" in lab for _, _, lab in shown)
            handles = []
            end_labels = []
            for leg, arr, lab in shown:
                ti = next((k for k, t in enumerate(p["targets"]) if legend(t.get("legendFormat", ""), lab) == leg), 0)
                if per_model:
                    c = model_colour.get(lab["model"], "#bbbbbb")
                    used_models.add(lab["model"])
                elif "reason" in lab:
                    c = reason_colour.get(lab["reason"])
                elif leg == "success":
                    c = "#2ca02c"
                else:
                    c = palette[ti]
                style = styles[ti % 3] if len(targets) > 1 else "-"
                y = arr / div
                (h,) = ax.plot(times, y, style, lw=1.5 if style == ":" else 1.2, color=c, label=leg)
                handles.append(h)
                if len(shown) <= 3 and style == "-":
                    ax.fill_between(times, 0, y, color=c, alpha=0.1, lw=0)
                if unit == "s" and per_model and (np.nanmax(arr) >= 0.15 * vmax or np.ptp(arr[np.isfinite(arr)]) > 0):
                    end_labels.append((y[np.isfinite(y)][-1], lab["model"], c))
            ax.set_xlim(t_lo, t_hi + (0.14 * (t_hi - t_lo) if end_labels else 0))
            if log:
                ax.set_yscale("log")
                positive = np.concatenate([s[1][np.isfinite(s[1]) & (s[1] > 0)] for s in shown]) / div
                ax.set_ylim(bottom=np.percentile(positive, 1) / 2)
                ylabel += " (log scale)"
            else:
                ax.set_ylim(bottom=0, top=max(ax.get_ylim()[1], 1e-9))
            if unit == "percentunit":
                ax.set_ylim(top=max(1.0 / div, ax.get_ylim()[1]))
            ax.set_ylabel(ylabel, fontsize=8.5)
            if end_labels:
                # Model load time has a line per model: name the slow ones and
                # the ones that changed at their end, nudged apart on the axis' scale.
                f, finv = (np.log10, lambda v: 10**v) if log else (lambda v: v, lambda v: v)
                lo, hi = (f(v) for v in ax.get_ylim())
                last = 1e18
                for v, name, c in sorted(end_labels, reverse=True):
                    pos = min(f(v), last - 0.085 * (hi - lo))
                    last = pos
                    ax.text(times[-1], finv(pos), " " + name, fontsize=7, color=c if c != "#bbbbbb" else "#666666", va="center")
            ax.grid(alpha=0.3, lw=0.5)
            note = f"+{hidden} all-zero series hidden" if hidden else ""
            if per_model:
                # Colours name the models (the key at the top); line styles name the targets.
                keys = []
                if len(targets) > 1:
                    keys = [Line2D([], [], color="#444444", ls=styles[k % 3], lw=1.3) for k in range(len(targets))]
                    names = [re.sub(r"\{\{\s*model\s*\}\}\s*", "", t) or "value" for t in targets]
                    ax.legend(keys, names, fontsize=7.5, loc="upper right", frameon=True, framealpha=0.8, edgecolor="none", handlelength=2.2)
                if note:
                    ax.text(1.0, -0.17, note, fontsize=7, ha="right", va="top", color="#777777", transform=ax.transAxes)
            else:
                labels = [h.get_label() for h in handles]
                if note:
                    handles.append(Line2D([], [], color="none"))
                    labels.append(f"({note})")
                ax.legend(handles, labels, fontsize=7.5, loc="upper left", bbox_to_anchor=(0, -0.12), ncol=min(len(handles), 4), frameon=False, handlelength=1.8, columnspacing=1.2)

    c = data["counts"]
    ok = sum(v for k, v in c.items() if k.endswith(" ok"))
    bad = sum(v for k, v in c.items() if k.endswith(" failed"))
    fig.text(0.01, 1 - 0.1 / fig_h, "Tern's Grafana dashboard (deploy/grafana/tern.json), rendered with matplotlib, NOT by Grafana", fontsize=15, fontweight="bold", va="top")
    fig.text(
        0.01, 1 - 0.42 / fig_h,
        f"Each panel's PromQL evaluated over scrapes of Tern's /metrics taken every {interval:g} s during real traffic; "
        "one subplot per panel, laid out as in the dashboard.",
        fontsize=11, va="top",
    )
    desc = (
        f"Traffic: {seconds:g} s from tritonclient (HTTP and gRPC), {ok} requests answered and {bad} failed, against target/debug/tern serving "
        "model_repository/ plus two test-only plugins (misbehave, broken), on 2 CPU cores shared with other work. "
        "Phases (shaded alternately): steady low rate; rate ramping up, with back-to-back add_sub from 4 threads (dynamic batching); "
        "faults: wrong-shape requests to simple and add_sub, misbehave asked to error / panic / loop past its deadline / exceed its memory cap / "
        "sleep past its deadline with a backlog queued behind it (one gRPC client timing out), two loads of a plugin that is not "
        "WebAssembly; cool-down, with prep_c unloaded and loaded again from the .cwasm cache. "
        f"rate() and increase() use $__rate_interval = 4 × scrape interval = {rate_window:g} s; $instance = $model = All; "
        "x axis: seconds since the traffic started. CPU utilisation and RAM are the whole machine's."
    )
    fig.text(0.01, 1 - 0.72 / fig_h, "\n".join(textwrap.wrap(desc, 235)), fontsize=8.8, va="top", color="#333333", linespacing=1.35)
    # The model colour key.
    key = [m for m in model_colour if m in used_models]
    hs = [Line2D([], [], color=model_colour[m], lw=2.5) for m in key]
    fig.legend(hs, key, loc="upper left", bbox_to_anchor=(0.01, 1 - 1.33 / fig_h), ncol=min(len(key), 12), fontsize=8, frameon=False,
               title="Model colours, in every per-model panel (grey: models with a load time only):", title_fontsize=8.5, alignment="left", handlelength=1.5, columnspacing=1.3)
    notes = [f"“{', '.join(ts)}” ({row}): {why}" for row, ts, why in skipped]
    fig.text(0.01, 0.1 / fig_h, "Not drawn: " + "; ".join(notes) + ".", fontsize=8.5, color="#555555")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    tmp = out + ".tmp.png"
    fig.savefig(tmp, dpi=dpi, metadata={"Software": None}, facecolor="white")
    plt.close(fig)
    # A 256-colour palette keeps the PNG small; the plot has few colours anyway.
    from PIL import Image

    with Image.open(tmp) as im:
        im.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(out, optimize=True)
    os.remove(tmp)
    return drawn_titles, skipped


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(ROOT, "target", "debug", "tern"))
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "img", "dashboard.png"))
    ap.add_argument("--seconds", type=float, default=150.0, help="length of the traffic")
    ap.add_argument("--scrape-interval", type=float, default=2.0)
    ap.add_argument("--plugins-dir", default=os.path.join(ROOT, "target", "wasm32-wasip2", "release"))
    ap.add_argument("--save-scrapes", help="write the raw scrapes and traffic record here (JSON)")
    ap.add_argument("--from-scrapes", help="redraw from a --save-scrapes file; no server, no traffic")
    args = ap.parse_args()

    # Every target of every panel parses in the evaluator's subset, before any traffic.
    for p in panels(dashboard()):
        for t in p.get("targets", []):
            parse(substitute(t["expr"], 8))

    if args.from_scrapes:
        with open(args.from_scrapes) as f:
            data = json.load(f)
    else:
        t = time.monotonic()
        data = run_traffic(args)
        print(f"traffic and scrapes: {time.monotonic() - t:.0f} s, {len(data['scrapes'])} scrapes", file=sys.stderr)
        if args.save_scrapes:
            with open(args.save_scrapes, "w") as f:
                json.dump(data, f)
    drawn, skipped = draw(data, args.out)
    print(f"wrote {args.out} ({os.path.getsize(args.out) // 1024} KiB): {len(drawn)} panels drawn")
    for title in drawn:
        print(f"  drawn: {title}")
    for row, titles, why in skipped:
        print(f"  not drawn: {row}: {', '.join(titles)} ({why})")


if __name__ == "__main__":
    main()
